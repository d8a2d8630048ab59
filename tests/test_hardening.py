"""Runtime faults and safety: one sentence on stderr, the documented exit code, nothing half-written.

A tiny random-init Llama is exported once per module; each run test copies that export cache
into its own output dir so only the stage under test does real work.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import spdflow.plugins
from spdflow.api import ModelInfo, Proposal, Proposer
from spdflow.cli import cli
from spdflow.engine import cache
from spdflow.errors import RecipeError
from spdflow.hookspecs import hookimpl
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import read_recipe
from spdflow.workload import MAX_PROMPT_FILE_BYTES, load_prompts, read_prompt_file

RECIPE = """\
version: 1
name: tiny
model:
  id: {model}
proposer:
  uses: {proposer}
num_speculative_tokens: [0, 2]
specialization:
  prefill_seq_len: 8
  ctx_len: 64
devices:
  backend: onnxruntime
  with: {{threads: 1}}
workload:
  prompts: {prompts}
  max_new_tokens: {max_new_tokens}
output: out
"""


def recipe_text(model: str = "tiny", proposer: str = "prompt_lookup", prompts: str = '["def f(x): return x"]',
                max_new_tokens: int = 12) -> str:
    return RECIPE.format(model=model, proposer=proposer, prompts=prompts, max_new_tokens=max_new_tokens)


@pytest.fixture(scope="module")
def tiny_home(tmp_path_factory) -> Path:
    """A folder with a tiny model and a finished run of it (the export cache to copy)."""
    from spdflow.testing.models import make_tiny_model

    home = tmp_path_factory.mktemp("tiny_home")
    make_tiny_model(home / "tiny", num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1)
    (home / "recipe.yaml").write_text(recipe_text())
    before = _files(home)
    cwd = os.getcwd()
    os.chdir(home)  # output: out is relative to the current directory
    try:
        result = CliRunner().invoke(cli, ["run", "-q", str(home / "recipe.yaml")])
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    (home / "written.json").write_text(json.dumps(sorted(str(p) for p in _files(home) - before)))
    return home


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def home(tiny_home, tmp_path, monkeypatch) -> Path:
    """This test's folder: the tiny model, a copy of the export cache, and the cwd set to it."""
    shutil.copytree(tiny_home / "tiny", tmp_path / "tiny")  # a symlink out of the folder would be refused
    shutil.copytree(tiny_home / "out" / "export", tmp_path / "out" / "export")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(home: Path, text: str, *args: str):
    path = home / "recipe.yaml"
    path.write_text(text)
    return CliRunner().invoke(cli, ["run", "-q", *args, str(path)])


def assert_one_sentence(result, code: int, text: str) -> None:
    assert result.exit_code == code, result.output
    assert text in result.stderr, result.stderr
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr


def report(home: Path) -> dict:
    return json.loads((home / "out" / "report.json").read_text())


def no_temp_left(root: Path) -> None:
    leftovers = [p for p in root.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, leftovers


# ------------------------------------------------------------------------------- runtime faults


def test_missing_model_dir_is_exit_1_before_any_work(home):
    result = run(home, recipe_text(model="./nope"))
    assert_one_sentence(result, 1, "model './nope' is not a directory (relative paths are resolved against")
    assert not (home / "out" / "report.json").exists()


def test_truncated_weights_fail_the_export_without_leftovers(home):
    broken = home / "broken"
    shutil.copytree(home / "tiny", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run(home, recipe_text(model="broken"))
    assert_one_sentence(result, 1, "export: cannot load the model in")
    assert "SafetensorError" in result.stderr
    assert report(home)["status"] == "failed" and report(home)["error"]["stage"] == "export"
    no_temp_left(home / "out")


def test_prompt_longer_than_ctx_len_names_the_prompt(home):
    result = run(home, recipe_text(prompts='["ok", "' + "x = 1; " * 60 + '"]'))
    assert_one_sentence(result, 1, "prompt 1 has")
    assert "but ctx_len 64 leaves room for 63" in result.stderr and "SPD109" in result.stderr
    assert not (home / "out" / "report.json").exists(), "preflight stops the run before any export"


def test_empty_prompt_is_exit_1(home):
    assert_one_sentence(run(home, recipe_text(prompts='[""]')), 1, "prompt 0 is empty")


def test_max_new_tokens_beyond_ctx_len_is_an_invalid_recipe(home):
    result = run(home, recipe_text(max_new_tokens=100))
    assert_one_sentence(result, 3, "SPD034 max_new_tokens 100 cannot fit in ctx_len 64")


def test_empty_prompt_list_is_an_invalid_recipe(home):
    assert_one_sentence(run(home, recipe_text(prompts="[]")), 3, "SPD035 workload.prompts is empty")


class _FailingProposer(Proposer):
    """Proposes one token twice, then raises: a plugin bug in the middle of a run."""

    name = "boom"

    def __init__(self):
        self.calls = 0

    def propose(self, inputs):
        self.calls += 1
        if self.calls > 2:
            raise RuntimeError("kaboom")
        return [Proposal(item.tokens[-1:].copy()) for item in inputs]


class _FakeProposerPlugin:
    @staticmethod
    @hookimpl
    def spdflow_register_proposers(register):
        register("boom", lambda config, ctx: _FailingProposer())


def test_proposer_raising_mid_run_names_plugin_and_version(home, monkeypatch):
    def patched(**kwargs):
        pm = get_plugin_manager(**kwargs)
        pm.add_plugin(_FakeProposerPlugin, "fake_boom", distribution="fake-boom", version="9.9.9")
        return pm

    monkeypatch.setattr(spdflow.plugins, "get_plugin_manager", patched)
    result = run(home, recipe_text(proposer="boom"))
    assert_one_sentence(result, 4, "proposer 'boom' (plugin 'fake_boom' 9.9.9) failed: RuntimeError: kaboom")
    assert report(home)["status"] == "failed" and report(home)["error"]["stage"] == "generate"


def test_backend_session_failure_is_one_sentence(home, monkeypatch):
    from spdflow_ort.session import OrtSession

    def broken_run(self, *args, **kwargs):
        raise RuntimeError("device lost\nsecond line that must not be shown")

    monkeypatch.setattr(OrtSession, "run", broken_run)
    result = run(home, recipe_text())
    assert_one_sentence(result, 1, "stage 'generate' failed: RuntimeError: device lost")
    assert "second line" not in result.stderr
    assert report(home)["status"] == "failed"


def test_traceback_only_with_verbose(home, monkeypatch):
    from spdflow_ort.session import OrtSession

    monkeypatch.setattr(OrtSession, "run", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("device lost")))
    path = home / "recipe.yaml"
    path.write_text(recipe_text())
    monkeypatch.setenv("SPDFLOW_DEBUG", "0")  # only --verbose asks for the traceback
    result = CliRunner().invoke(cli, ["--verbose", "run", "-q", str(path)])
    assert result.exit_code == 1 and "Traceback" in result.stderr


def _enospc_for(name: str, monkeypatch) -> None:
    """os.replace (atomic writes) fails with ENOSPC for files called ``name``."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name == name:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


def test_disk_full_while_writing_the_report(home, monkeypatch):
    _enospc_for("report.json", monkeypatch)
    result = run(home, recipe_text())
    assert_one_sentence(result, 1, "cannot write the run report in 'out': OSError: [Errno 28] No space left on device")
    assert not (home / "out" / "report.json").exists()
    no_temp_left(home / "out")


def test_disk_full_while_exporting_leaves_nothing_half_written(home, monkeypatch):
    shutil.rmtree(home / "out" / "export")
    _enospc_for(cache.DONE_MARKER, monkeypatch)
    result = run(home, recipe_text())
    assert_one_sentence(result, 1, "stage 'export' failed: OSError: [Errno 28] No space left on device")
    assert report(home)["status"] == "failed"
    assert not list((home / "out" / "export").iterdir())
    no_temp_left(home / "out")


# ------------------------------------------------------------------------------- damaged caches


def flat(text: str) -> str:
    """Console text without the line wrapping of the terminal width."""
    return " ".join(text.split())


def _outputs(home: Path) -> list[list[int]]:
    return [json.loads(line)["tokens"] for line in (home / "out" / "outputs.jsonl").read_text().splitlines()]


def _program_file(home: Path, pattern: str) -> Path:
    return next((home / "out" / "export").glob(f"target-*/qpc-*/qpc/{pattern}"))


def _reference_outputs(tiny_home: Path) -> list[list[int]]:
    return [json.loads(line)["tokens"] for line in (tiny_home / "out" / "outputs.jsonl").read_text().splitlines()]


def test_a_program_with_damaged_weights_is_rebuilt_not_used(home, tiny_home):
    weights = _program_file(home, "model.onnx.data")
    data = bytearray(weights.read_bytes())
    data[: 1 << 20] = bytes(min(1 << 20, len(data)))  # 1 MiB zeroed, written as a new file
    weights.unlink()
    weights.write_bytes(bytes(data))
    result = run(home, recipe_text(), "--check-lossless")
    assert result.exit_code == 0, result.output
    assert "warning: program qpc-" in result.stderr
    assert "'qpc/model.onnx.data' does not match its recorded hash" in flat(result.stderr)
    stages = {s["name"]: s for s in report(home)["stages"]}
    assert stages["compile"]["status"] == "ran" and "not trusted" in stages["compile"]["reason"]
    assert _outputs(home) == _reference_outputs(tiny_home)


def test_a_damaged_graph_that_hides_its_mtime_is_rebuilt_when_it_fails_to_load(home, tiny_home):
    graph = _program_file(home, "decode_k2_*.onnx")
    stat = graph.stat()
    data = bytearray(graph.read_bytes())
    data[100:400] = bytes(300)
    graph.write_bytes(bytes(data))
    os.utime(graph, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    result = run(home, recipe_text())
    assert result.exit_code == 0, result.output
    assert "failed to load and is damaged ('qpc/decode_k2_" in flat(result.stderr)
    assert _outputs(home) == _reference_outputs(tiny_home)
    assert run(home, recipe_text()).exit_code == 0  # and it stays fixed


def test_verify_hashes_every_cached_file(home, tiny_home):
    weights = _program_file(home, "model.onnx.data")
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-4096:] = bytes(4096)
    with open(weights, "r+b") as handle:
        handle.write(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    result = run(home, recipe_text(), "--verify")
    assert result.exit_code == 0, result.output
    assert "'qpc/model.onnx.data' does not match its recorded hash" in flat(result.stderr)
    assert _outputs(home) == _reference_outputs(tiny_home)


def test_draft_with_another_tokenizer_is_refused(tmp_path):
    from spdflow.zoo import zoo_path
    from spdflow_proposers.draft_model import check_draft_compatible

    source = zoo_path("tinycode-target") / "tokenizer.json"
    other = tmp_path / "tokenizer.json"
    data = json.loads(source.read_text())
    data["added_tokens"][0]["content"] = "<|something-else|>"
    other.write_text(json.dumps(data))

    def info(name: str, tokenizer: Path, vocab: int = 4096) -> ModelInfo:
        return ModelInfo(name, "llama", vocab, 1, 1, 16, (0,), 1, tokenizer.parent, tokenizer)

    check_draft_compatible("same", info("d", source), info("t", source))
    with pytest.raises(RecipeError, match="have different tokenizers"):
        check_draft_compatible("other", info("d", other), info("t", source))
    with pytest.raises(RecipeError, match="has vocab 32000 but target 't' has 4096"):
        check_draft_compatible("big", info("d", source, 32000), info("t", source))


# ------------------------------------------------------------------------------- safety


PYTHON_TAGS = [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/new:os.system ['touch {marker}']",
    "!!python/name:os.system",
    "!!python/module:os",
    "!!python/object:spdflow.recipe.schema.Recipe {{}}",
]


@pytest.mark.parametrize("tag", PYTHON_TAGS)
def test_yaml_never_constructs_python_objects(tag, tmp_path, pm):
    marker = tmp_path / "pwned"
    path = tmp_path / "recipe.yaml"
    path.write_text(f"version: 1\nname: x\nmodel:\n  id: {tag.format(marker=marker)}\n")
    loaded = read_recipe(path, pm)
    assert [f.code for f in loaded.findings] == ["SPD003"]
    assert "unsupported YAML tag" in loaded.findings[0].message
    assert not marker.exists()


def test_a_module_path_in_a_recipe_is_just_an_unknown_name(tmp_path, pm, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_spd_plugin.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                                 "class Proposer: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent("""\
        version: 1
        name: x
        model: {id: spdflow:tinycode-target}
        proposer: {uses: "evil_spd_plugin:Proposer"}
        num_speculative_tokens: [0, 2]
        k_policy: evil_spd_plugin
        acceptance: evil_spd_plugin.accept
        devices: {backend: evil_spd_plugin}
        workload: {builtin: evil_spd_plugin}
        """))
    loaded = read_recipe(path, pm)
    assert sorted(f.code for f in loaded.findings) == ["SPD020", "SPD021", "SPD022", "SPD023", "SPD024"]
    assert "unknown proposer 'evil_spd_plugin:Proposer'" in loaded.findings[0].message
    assert not marker.exists() and "evil_spd_plugin" not in sys.modules


def test_paths_in_a_recipe_are_relative_to_the_recipe_file(tmp_path, pm, monkeypatch):
    recipe_dir, elsewhere = tmp_path / "recipes", tmp_path / "elsewhere"
    for folder in (recipe_dir, elsewhere):
        (folder / "model").mkdir(parents=True)
        (folder / "model" / "config.json").write_text("{}")
    (recipe_dir / "prompts.txt").write_text("from the recipe folder\n")
    (elsewhere / "prompts.txt").write_text("from the cwd\n")
    path = recipe_dir / "r.yaml"
    path.write_text("version: 1\nname: x\nmodel: {id: model}\nworkload: {file: prompts.txt}\n")
    monkeypatch.chdir(elsewhere)
    loaded = read_recipe(path, pm)
    assert not loaded.errors
    assert load_prompts(loaded.recipe.workload, loaded.base_dir, pm) == ["from the recipe folder"]
    from spdflow.models import resolve_model_dir

    assert resolve_model_dir("model", loaded.base_dir) == (recipe_dir / "model").resolve()


@pytest.fixture
def secret(tmp_path_factory) -> Path:
    """A file outside the recipe's folder (a sibling folder) that a hostile recipe would like to read."""
    path = tmp_path_factory.mktemp("secrets") / "token.txt"
    path.write_text("SECRET-VALUE-1234\n")
    return path


def _hostile(home: Path, **paths: str) -> str:
    text = recipe_text()
    if "file" in paths:
        text = text.replace('  prompts: ["def f(x): return x"]', f"  file: {paths['file']}")
    if "model" in paths:
        text = text.replace("  id: tiny", f"  id: {paths['model']}")
    return text


@pytest.mark.parametrize("how", ["absolute", "relative", "symlink"])
def test_a_recipe_cannot_read_a_file_outside_its_folder(home, secret, how):
    if how == "symlink":
        (home / "innocent.txt").symlink_to(secret)
    file = {"absolute": str(secret), "relative": f"../{secret.parent.name}/{secret.name}", "symlink": "innocent.txt"}[how]
    assert (home / file).resolve() == secret.resolve()
    result = run(home, _hostile(home, file=file))
    assert_one_sentence(result, 3, "the recipe reads files outside its folder")
    assert "SPD112 workload.file" in result.stderr
    out = home / "out"
    assert not any("SECRET-VALUE" in p.read_text(errors="replace") for p in out.rglob("*.json*") if p.is_file())


def test_a_model_dir_outside_the_recipe_folder_needs_the_flag(home, tiny_home):
    outside = str(tiny_home / "tiny")
    result = run(home, _hostile(home, model=outside))
    assert_one_sentence(result, 3, "the recipe reads files outside its folder")
    assert "SPD112 model.id" in result.stderr
    assert run(home, _hostile(home, model=outside), "--allow-outside-paths").exit_code == 0


def test_lint_warns_about_paths_outside_the_recipe_folder(home, secret):
    path = home / "recipe.yaml"
    path.write_text(_hostile(home, file=str(secret)))
    result = CliRunner().invoke(cli, ["lint", str(path)])
    assert result.exit_code == 0, result.output  # a warning
    assert "SPD112 warning: workload.file" in result.output and "outside the recipe's folder" in result.output
    assert CliRunner().invoke(cli, ["lint", "--strict", str(path)]).exit_code == 1


def test_the_flag_lets_a_trusted_recipe_read_outside(home, secret):
    result = run(home, _hostile(home, file=str(secret)), "--allow-outside-paths")
    assert result.exit_code == 0, result.output


def test_library_calls_are_confined_by_default(tmp_path, secret, pm):
    from spdflow.recipe.paths import PathOutsideRecipeError

    path = tmp_path / "r" / "r.yaml"
    path.parent.mkdir()
    path.write_text(f"version: 1\nname: x\nmodel: {{id: spdflow:tinycode-target}}\nworkload: {{file: {secret}}}\n")
    loaded = read_recipe(path, pm)
    with pytest.raises(PathOutsideRecipeError):
        load_prompts(loaded.recipe.workload, loaded.base_dir, pm)
    assert load_prompts(loaded.recipe.workload, loaded.base_dir, pm, allow_outside=True) == ["SECRET-VALUE-1234"]


def test_prompt_file_over_the_size_limit_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as handle:  # sparse: no 16 MiB written
        handle.truncate(MAX_PROMPT_FILE_BYTES + 1)
    with pytest.raises(RecipeError, match=r"over the 16,777,216-byte limit") as info:
        read_prompt_file(big)
    assert info.value.exit_code == 3


def test_a_run_writes_only_under_its_output_dir(tiny_home):
    written = json.loads((tiny_home / "written.json").read_text())
    assert written and all(Path(p).parts[0] == "out" for p in written), written
    assert (tiny_home / "out" / "report.json").is_file()


# ------------------------------------------------------------------------------- the error catalogue

REPO = Path(__file__).resolve().parents[1]


def test_docs_errors_md_is_generated_from_the_catalogue():
    from spdflow.catalog import render_markdown

    assert (REPO / "docs" / "errors.md").read_text() == render_markdown(), \
        "docs/errors.md is stale: run `python -m spdflow.catalog > docs/errors.md`"


def test_every_spd_code_in_the_source_is_catalogued_and_no_entry_is_stale():
    import re

    from spdflow.catalog import ENTRIES

    sources = [p for folder in ("spdflow", "plugins") for p in (REPO / folder).rglob("*.py") if p.name != "catalog.py"]
    used = {code for p in sources for code in re.findall(r"SPD\d{3}", p.read_text())}
    documented = {e.code for e in ENTRIES if e.code.startswith("SPD")}
    assert used - documented == set(), "codes used in the source but missing from spdflow/catalog.py"
    assert documented - used == set(), "catalogue entries whose code the source no longer uses"


def test_every_error_class_is_catalogued_with_its_exit_code():
    import inspect

    from spdflow import errors
    from spdflow.catalog import RUNTIME
    from spdflow.models import ModelNotFoundError

    classes = {c.__name__: c for c in vars(errors).values()
               if inspect.isclass(c) and issubclass(c, errors.SpdflowError) and c is not errors.SpdflowError}
    classes["ModelNotFoundError"] = ModelNotFoundError
    documented = {e.error for e in RUNTIME}
    assert set(classes) <= documented
    for entry in RUNTIME:
        if entry.error in classes:
            assert classes[entry.error].exit_code == entry.exit_code, entry.code


# ------------------------------------------------------------------------------- the output dir


def test_an_output_path_that_is_a_file_is_one_sentence(home):
    (home / "taken").write_text("not a dir")
    result = run(home, recipe_text().replace("output: out", "output: taken"))
    assert_one_sentence(result, 1, "the output dir 'taken' is an existing file, not a directory")
    assert "internal error" not in result.stderr


def test_an_output_path_with_a_nul_byte_is_one_sentence(home):
    result = run(home, recipe_text().replace("output: out", 'output: "a\\0b"'))
    assert result.exit_code in (1, 3), result.output
    assert "NUL" in result.stderr and "internal error" not in result.stderr and "Traceback" not in result.output


def test_a_read_only_output_dir_is_one_sentence(home, monkeypatch):
    real = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.name == "ro":
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    result = run(home, recipe_text().replace("output: out", "output: ro"))
    assert_one_sentence(result, 1, "cannot use the output dir 'ro': the file system is read-only")


def test_a_second_run_into_a_locked_output_dir_names_the_first(home):
    from spdflow.engine.outdir import OutputDirLock

    (home / "out").mkdir(exist_ok=True)
    lock = OutputDirLock(home / "out").acquire()
    try:
        result = run(home, recipe_text())
    finally:
        lock.release()
    assert_one_sentence(result, 1, f"output dir 'out' is in use by another spdflow run (pid {os.getpid()}")
    assert run(home, recipe_text()).exit_code == 0  # released: the next run goes ahead


def test_stale_temp_dirs_of_a_killed_run_are_removed_at_start(home):
    export = home / "out" / "export"
    target = next(export.glob("target-*"))
    stale = [export / ".target-0123.abcd.tmp", target / ".qpc-0123.efgh.tmp", home / "out" / ".report.json.x1.tmp"]
    stale[0].mkdir()
    (stale[0] / "model.onnx").write_bytes(b"half")
    stale[1].mkdir()
    stale[2].write_text("{")
    result = run(home, recipe_text())
    assert result.exit_code == 0, result.output
    assert not any(p.exists() for p in stale)
    no_temp_left(home / "out")
