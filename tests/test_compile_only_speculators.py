"""``run --compile-only`` on QAIC for the proposers that read the target's own states: the EAGLE
layer is a program of its own (stages ``export:eagle`` ..., own specializations.json, custom IO
and compiler command), the target gains its ``hidden_states`` output; a multi-projection target
is one program whose logits are 4-D. Each program's compile.sh is run with the recording fake
compiler, as on a QAIC host, and every symbol of its graph's IO must be bound by every shape."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from spdflow.cli import cli
from tests.test_compile_only import workdir  # noqa: F401  (the module's cwd, a fixture)

FAKE_COMPILER = Path(__file__).parent / "plugins" / "fake_qaic_compile"
RECIPE = """\
version: 1
name: {name}
model:
  id: spdflow:tinycode-target
proposer:
  uses: {proposer}
num_speculative_tokens: [0, 2, 4]
specialization:
  prefill_seq_len: 16
  ctx_len: 64
  {batching}
devices:
  backend: qaic
workload:
  prompts: ["def f(x):"]
  max_new_tokens: 4
"""


def compile_only(workdir: Path, name: str, proposer: str, batching: str = "batch_size: 1") -> dict[str, dict]:
    """Run the recipe with --compile-only (no compiler installed); its report's stages by name."""
    path = workdir / f"{name}.yaml"
    path.write_text(RECIPE.format(name=name, proposer=proposer, batching=batching))
    env = {k: v for k, v in os.environ.items() if k != "QAIC_COMPILER"}
    result = CliRunner().invoke(cli, ["run", str(path), "--compile-only"], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads((workdir / "runs" / name / "report.json").read_text())
    return {stage["name"]: stage for stage in report["stages"]}


def run_compile_sh(qpc_dir: Path, record: Path) -> list[str]:
    """Run the program's compile.sh with the recording fake compiler; the argv it got."""
    record.unlink(missing_ok=True)
    env = {**os.environ, "QAIC_COMPILER": str(FAKE_COMPILER), "FAKE_QAIC_RECORD": str(record)}
    subprocess.run(["sh", str(qpc_dir / "compile.sh")], check=True, env=env, capture_output=True)
    [argv] = [json.loads(line) for line in record.read_text().splitlines()]
    return argv


def flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in argv[1:] if "=" in arg)


def io_shapes(onnx_path: Path) -> dict[str, list]:
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(graph.input) + list(graph.output)}


def assert_every_symbol_bound(shapes: dict[str, list], specializations: list[dict]) -> None:
    symbols = {d for dims in shapes.values() for d in dims if isinstance(d, str)}
    for spec in specializations:
        assert symbols <= set(spec), f"{sorted(symbols - set(spec))} not bound by {spec}"


def test_eagle_layer_is_its_own_qaic_program(workdir):
    stages = compile_only(workdir, "eagle", "eagle")
    names = list(stages)
    assert names[:6] == ["export", "specialize", "compile", "export:eagle", "specialize:eagle", "compile:eagle"]
    assert "2 program(s) written" in stages["generate"]["reason"]
    assert stages["export:eagle"]["detail"]["graph"] == "eagle_layer"
    target_qpc = Path(stages["compile"]["detail"]["qpc_dir"])
    eagle_qpc = Path(stages["compile:eagle"]["detail"]["qpc_dir"])
    assert target_qpc.parent != eagle_qpc.parent and eagle_qpc.parent.name.startswith("eagle-")

    # The target: the usual shapes, plus the hidden_states output the layer reads.
    target_io = io_shapes(target_qpc.parent / "model.onnx")
    assert target_io["hidden_states"] == ["batch_size", "seq_len", 256]
    assert target_io["logits"] == ["batch_size", "num_logits_to_keep", 4096]
    # The layer: token + target feature in, guesses + predicted features out, one KV layer.
    eagle_io = io_shapes(eagle_qpc.parent / "model.onnx")
    assert list(eagle_io) == ["input_ids", "hidden_states", "position_ids", "past_key.0", "past_value.0",
                              "num_logits_to_keep", "logits", "hidden_states_out", "past_key.0_RetainedState",
                              "past_value.0_RetainedState"]
    assert eagle_io["hidden_states"] == ["batch_size", "seq_len", 256]
    assert eagle_io["hidden_states_out"] == ["batch_size", "num_logits_to_keep", 256]
    assert eagle_io["past_key.0"] == ["batch_size", 2, "ctx_len", 64]

    eagle_specs = json.loads((eagle_qpc / "specializations.json").read_text())["specializations"]
    # prefill (catch-up chunks), K=0 (one drafted token), then a catch-up of up to K+1 tokens
    assert [(s["seq_len"], s["num_logits_to_keep"]) for s in eagle_specs] == [("16", "1"), ("1", "1"), ("3", "3"),
                                                                             ("5", "5")]
    assert_every_symbol_bound(eagle_io, eagle_specs)
    target_specs = json.loads((target_qpc / "specializations.json").read_text())["specializations"]
    assert_every_symbol_bound(target_io, target_specs)
    custom_io = (eagle_qpc / "custom_io.yaml").read_text()
    assert "past_key.0_RetainedState" in custom_io and "past_key.1" not in custom_io

    # Each compile.sh, run as on a QAIC host, hands the compiler its own graph and files.
    for qpc in (target_qpc, eagle_qpc):
        argv = run_compile_sh(qpc, workdir / "record.jsonl")
        given = flags(argv)
        assert Path(given["-m"]).resolve() == (qpc.parent / "model.onnx").resolve()
        assert Path(given["-network-specialization-config"]).resolve() == (qpc / "specializations.json").resolve()
        assert Path(given["-custom-IO-list-file"]).resolve() == (qpc / "custom_io.yaml").resolve()
        assert "-retained-state" in argv and (qpc / "qpc" / "programqpc.bin").is_file()
        recorded = stages["compile" if qpc == target_qpc else "compile:eagle"]["detail"]["command"]
        assert [a.split("=")[0] for a in argv[1:]] == [a.split("=")[0] for a in recorded[1:]]


def test_eagle_layer_under_continuous_batching_addresses_its_cache_rows(workdir):
    stages = compile_only(workdir, "eagle-cb", "eagle", "batch_size: 1\n  full_batch_size: 2")
    eagle_qpc = Path(stages["compile:eagle"]["detail"]["qpc_dir"])
    eagle_io = io_shapes(eagle_qpc.parent / "model.onnx")
    assert eagle_io["batch_index"] == ["batch_size", 1]
    assert eagle_io["past_key.0"] == ["full_batch_size", 2, "ctx_len", 64]
    specs = json.loads((eagle_qpc / "specializations.json").read_text())["specializations"]
    assert all(s["full_batch_size"] == "2" for s in specs)
    assert_every_symbol_bound(eagle_io, specs)


def test_multi_projection_target_is_one_qaic_program_with_4d_logits(workdir):
    stages = compile_only(workdir, "multiproj", "multi_projection")
    assert [n for n in stages if n.startswith("compile")] == ["compile"]
    assert "1 program(s) written" in stages["generate"]["reason"]
    qpc = Path(stages["compile"]["detail"]["qpc_dir"])
    io = io_shapes(qpc.parent / "model.onnx")
    assert io["logits"] == ["batch_size", "num_logits_to_keep", 5, 4096]  # LM head + 4 heads
    assert "hidden_states" not in io
    specs = json.loads((qpc / "specializations.json").read_text())["specializations"]
    assert [s["seq_len"] for s in specs] == ["16", "1", "3", "5"]
    assert_every_symbol_bound(io, specs)
    argv = run_compile_sh(qpc, workdir / "record.jsonl")
    assert Path(flags(argv)["-m"]).resolve() == (qpc.parent / "model.onnx").resolve()
    assert (qpc / "qpc" / "programqpc.bin").is_file()


def test_dry_run_lists_the_eagle_program(workdir):
    path = workdir / "eagle.yaml"
    result = CliRunner().invoke(cli, ["run", str(path), "--dry-run"],
                                env={k: v for k, v in os.environ.items() if k != "QAIC_COMPILER"})
    assert result.exit_code == 0, result.output
    assert "program 'eagle': spdflow:tinycode-target" in result.stdout
    assert "K-list [0, 2, 4]" in result.stdout
