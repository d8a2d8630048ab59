"""``run --compile-only`` and ``run --dry-run`` are the engine's: every program (the target's and a
draft's) is built or described, nothing is generated, on either backend, first run or cached."""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from spdflow.cli import cli

DRAFT = """\
version: 1
name: draftco
model:
  id: spdflow:tinycode-target
proposer:
  uses: draft_model
  with:
    model: spdflow:tinycode-draft
num_speculative_tokens: [0, 2]
specialization:
  prefill_seq_len: 16
  ctx_len: 64
devices:
  backend: {backend}
workload:
  prompts: ["def f(x):"]
  max_new_tokens: 4
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One folder for the module: the exports of the first run are reused (cached) by the rest."""
    path = tmp_path_factory.mktemp("compile_only")
    old = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(old)


def _recipe(workdir: Path, backend: str) -> Path:
    path = workdir / f"{backend}.yaml"
    path.write_text(DRAFT.format(backend=backend).replace("name: draftco", f"name: draftco-{backend}"))
    return path


def _run(*args):
    result = CliRunner().invoke(cli, ["run", *map(str, args)])
    return result


def _stages(workdir: Path, backend: str) -> dict[str, dict]:
    report = json.loads((workdir / "runs" / f"draftco-{backend}" / "report.json").read_text())
    return {stage["name"]: stage for stage in report["stages"]}


def test_qaic_compile_only_writes_the_target_and_the_draft_program(workdir, monkeypatch):
    monkeypatch.delenv("QAIC_COMPILER", raising=False)
    result = _run(_recipe(workdir, "qaic"), "--compile-only")
    assert result.exit_code == 0, result.output
    stages = _stages(workdir, "qaic")
    assert [name for name in stages][:7] == [
        "export", "specialize", "compile", "export:draft", "specialize:draft", "compile:draft", "generate"]
    assert stages["generate"]["status"] == "skipped" and "2 program(s) written" in stages["generate"]["reason"]
    for name, role in (("compile", "target"), ("compile:draft", "draft")):
        qpc = Path(stages[name]["detail"]["qpc_dir"])
        assert stages[name]["detail"]["role"] == role and stages[name]["status"] == "ran"
        assert (qpc / "compile.sh").is_file() and (qpc / "specializations.json").is_file()
        assert not (qpc / "qpc" / "programqpc.bin").exists()
    draft_shapes = json.loads((Path(stages["compile:draft"]["detail"]["qpc_dir"]) / "specializations.json").read_text())
    assert [s["seq_len"] for s in draft_shapes["specializations"]] == ["16", "1", "2"]


def test_qaic_compile_only_again_with_compiled_programs_still_generates_nothing(workdir, monkeypatch):
    monkeypatch.delenv("QAIC_COMPILER", raising=False)
    for name in ("compile", "compile:draft"):
        program = Path(_stages(workdir, "qaic")[name]["detail"]["qpc_dir"]) / "qpc"
        program.mkdir(exist_ok=True)
        (program / "programqpc.bin").write_bytes(b"compiled on a QAIC host")
    result = _run(_recipe(workdir, "qaic"), "--compile-only")
    assert result.exit_code == 0, result.output
    stages = _stages(workdir, "qaic")
    assert stages["compile"]["status"] == stages["compile:draft"]["status"] == "cached"
    assert stages["generate"]["status"] == "skipped"
    assert not (workdir / "runs" / "draftco-qaic" / "outputs.jsonl").read_text().strip()


def test_dry_run_prints_every_program_with_its_exact_compile_command(workdir, monkeypatch):
    monkeypatch.delenv("QAIC_COMPILER", raising=False)
    result = _run(_recipe(workdir, "qaic"), "--dry-run")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "program 'target': spdflow:tinycode-target" in out and "program 'draft': spdflow:tinycode-draft" in out
    assert "    decode   batch_size=1 seq_len=2 ctx_len=64 num_logits_to_keep=2" in out
    commands = [line.split("compile command: ", 1)[1] for line in out.splitlines() if "compile command: " in line]
    # The exports exist (earlier tests), so the commands are exactly the ones the compile ran.
    stages = _stages(workdir, "qaic")
    assert [shlex.split(c) for c in commands] == [stages[n]["detail"]["command"] for n in ("compile", "compile:draft")]
    assert not (workdir / "dry.txt").exists()


def test_onnxruntime_compile_only_never_generates_first_run_or_cached(workdir):
    recipe = _recipe(workdir, "onnxruntime")
    for expected in ("ran", "cached"):
        result = _run(recipe, "--compile-only")
        assert result.exit_code == 0, result.output
        stages = _stages(workdir, "onnxruntime")
        assert stages["compile"]["status"] == stages["compile:draft"]["status"] == expected
        assert stages["generate"]["status"] == "skipped"
        assert "generate: ran" not in result.output
