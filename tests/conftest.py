"""Shared fixtures: a fresh plugin manager per test, a recipe writer, and the sweep tests' 2x2 sweep
(proposers x K-lists of the embedded model), run once per session by the local executor; the Ray
tests compare their tokens with it. Also :func:`load_benchmark` for the tests of benchmarks/."""
from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from spdflow.cli import cli
from spdflow.plugins import get_plugin_manager

REPO = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """The script ``benchmarks/<name>.py`` as a module, registered in ``sys.modules`` (dataclasses
    look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def markdown_rows(out: str, header: str) -> dict[str, list[str]]:
    """A benchmark's printed markdown table as {first cell: the other cells}, the header row
    (the one whose first cell is ``header``) left out."""
    return {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| ") and not line.startswith(f"| {header} ")}


def run_table_benchmark(name: str, tmp_path: Path, capsys, *args: str, header: str = "mode"):
    """Run ``benchmarks/<name>.py`` on the default recipe with ``args`` (its output under
    ``tmp_path``), check it exits 0, and return its table's rows (:func:`markdown_rows`)."""
    module = load_benchmark(name)
    rc = module.main([str(REPO / "recipes" / "tinycode_varK.yaml"), *args, "--set", f"output={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return markdown_rows(out, header)


def record_code_run(runs: Path) -> None:
    """A short recorded run of the default recipe (2 prompts x 24 tokens) at ``runs / "code"``,
    the layout ``k_policy_replay.py --make-runs`` writes."""
    out = runs / "code"
    result = CliRunner().invoke(cli, ["run", str(REPO / "recipes" / "tinycode_varK.yaml"), "-q",
                                      "--allow-outside-paths", "--set", f"output={out}", "--set", "workload.count=2",
                                      "--set", "workload.max_new_tokens=24"])
    assert result.exit_code == 0, result.output

MINIMAL = """\
version: 1
name: t
model:
  id: spdflow:tinycode-target
proposer:
  uses: prompt_lookup
num_speculative_tokens: [0, 4]
workload:
  prompts: ["def f(x):"]
  max_new_tokens: 8
"""


@pytest.fixture
def pm():
    return get_plugin_manager()


@pytest.fixture
def write_recipe(tmp_path):
    def write(text: str = MINIMAL, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


# ------------------------------------------------------------------------------- sweeps

SWEEP_2X2 = """\
version: 1
name: two-by-two
base:
  version: 1
  name: base
  model: {{id: spdflow:tinycode-target}}
  proposer: {{uses: prompt_lookup}}
  specialization: {{prefill_seq_len: 16, ctx_len: 128}}
  devices: {{backend: onnxruntime, with: {{threads: 1}}}}
  workload:
    prompts: ["def add(a, b):\\n    return a + b\\n\\ndef sub(a, b):", "for i in range(10):\\n    print(i)\\nfor j in"]
    max_new_tokens: {tokens}
matrix:
  proposer.uses: [prompt_lookup, suffix]
  num_speculative_tokens: [[0, 2], [0, 3]]
output: {output}
cache: {cache}
"""


def write_sweep(folder: Path, output: Path, tokens: int = 12, cache: Path | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    cache = json.dumps(str(cache)) if cache else "null"
    path.write_text(textwrap.dedent(SWEEP_2X2.format(output=json.dumps(str(output)), tokens=tokens, cache=cache)))
    return path


@pytest.fixture(scope="session")
def local_sweep(tmp_path_factory):
    """The 2x2 sweep run by `spdflow sweep --jobs 2`: two points at once build the shared export."""
    root = tmp_path_factory.mktemp("sweep-local")
    path = write_sweep(root, root / "out")
    result = CliRunner().invoke(cli, ["sweep", str(path), "--jobs", "2", "-q", "--json"])
    return {"path": path, "out": root / "out", "result": result}


@pytest.fixture
def sweep_file(local_sweep):
    """write(folder, output, tokens=12) -> a 2x2 sweep file sharing the session sweep's cache
    (its export and programs are built already)."""
    return lambda folder, output, tokens=12: write_sweep(folder, output, tokens, local_sweep["out"] / "cache")


@pytest.fixture(scope="session")
def tiny_speculator_model_dir(spdflow_workdir):
    """A tiny random Llama with random multi-projection heads and a random EAGLE layer.

    Built from scratch (not from ``tiny_model_dir``) so a test class may override
    ``tiny_model_dir`` with it, as the conformance suite's model."""
    from spdflow.testing.models import add_speculators, make_tiny_model

    base = make_tiny_model(spdflow_workdir / "models" / "tiny-llama-spec-base", seed=0)
    return add_speculators(base, spdflow_workdir / "models" / "tiny-llama-spec")


@pytest.fixture(scope="session")
def embedded_target_dir(spdflow_workdir):
    """A copy of the embedded target with its trained heads and EAGLE layer (a copy, so tests
    never write next to the package's files)."""
    import shutil

    from spdflow.zoo import zoo_path

    path = spdflow_workdir / "models" / "tinycode-target"
    if not path.is_dir():
        shutil.copytree(zoo_path("tinycode-target"), path)
    return path


@pytest.fixture(scope="session")
def embedded_target_eos_dir(spdflow_workdir, embedded_target_dir):
    """``embedded_target_dir`` where every id = 3 (mod 8) is an EOS token."""
    from spdflow.testing import fixtures

    return fixtures.make_eos_variant(embedded_target_dir, spdflow_workdir / "models" / "tinycode-target-eos",
                                     range(3, 4096, 8))


@pytest.fixture(scope="session")
def tiny_speculator_eos_model_dir(spdflow_workdir, tiny_speculator_model_dir):
    """``tiny_speculator_model_dir`` where every id = 3 (mod 8) is an EOS token."""
    from spdflow.testing import fixtures

    return fixtures.make_eos_variant(tiny_speculator_model_dir, spdflow_workdir / "models" / "tiny-llama-eos-spec",
                                     range(3, 4096, 8))
