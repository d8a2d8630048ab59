"""Preflight: the mistakes that used to surface only after export are caught by lint (with
line:col), by --dry-run and by run before any output exists — one function for all three."""
from __future__ import annotations

import os
import textwrap

import pytest
from click.testing import CliRunner

from spdflow.cli import cli
from spdflow.lint import lint_paths
from spdflow.preflight import preflight
from spdflow.recipe.loader import read_recipe

from conftest import MINIMAL


def located(result, code):
    """``line:col`` of each finding with ``code``."""
    return [f"{f.location.line}:{f.location.col}" for f in result.findings if f.code == code]


def lint_one(write_recipe, pm, text, **files):
    path = write_recipe(textwrap.dedent(text))
    for name, content in files.items():
        target = path.parent / name.replace("__", ".")
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    return lint_paths([str(path)], pm)


FILE_RECIPE = MINIMAL.replace('prompts: ["def f(x):"]', "file: prompts.txt")  # the file at line 9, col 9


def test_missing_prompt_file_is_caught_at_its_key(write_recipe, pm):
    result = lint_one(write_recipe, pm, FILE_RECIPE)
    assert located(result, "SPD107") == ["9:9"]
    assert "prompts.txt' does not exist" in result.findings[0].message and result.exit_code(strict=False) == 1


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe bad bytes\n", "is not UTF-8 text"),
    (b"a\x00b\n", "is binary"),
])
def test_unreadable_prompt_file_is_caught(write_recipe, pm, content, words):
    result = lint_one(write_recipe, pm, FILE_RECIPE, prompts__txt=content)
    assert located(result, "SPD107") == ["9:9"] and words in result.findings[0].message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_prompt_file_without_read_permission_is_caught(write_recipe, pm):
    path = write_recipe(FILE_RECIPE)
    (path.parent / "prompts.txt").write_text("def f():\n")
    (path.parent / "prompts.txt").chmod(0)
    result = lint_paths([str(path)], pm)
    assert located(result, "SPD107") == ["9:9"] and "cannot be read" in result.findings[0].message


def test_prompt_file_that_is_a_directory_is_caught(write_recipe, pm):
    path = write_recipe(FILE_RECIPE)
    (path.parent / "prompts.txt").mkdir()
    assert located(lint_paths([str(path)], pm), "SPD107") == ["9:9"]


def test_prompt_longer_than_ctx_len_is_caught_on_its_own_line(write_recipe, pm):
    text = MINIMAL.replace('prompts: ["def f(x):"]', 'prompts:\n    - "def f(x):"\n    - "' + "x = 1\\n" * 60 + '"') \
        + "specialization: {prefill_seq_len: 16, ctx_len: 64}\n"
    result = lint_one(write_recipe, pm, text)
    assert located(result, "SPD109") == ["11:7"]  # the second prompt's own line
    finding = [f for f in result.findings if f.code == "SPD109"][0]
    assert finding.message.startswith("prompt 1 has ") and "ctx_len 64 leaves room for 63" in finding.message


def test_prompt_too_long_in_a_file_names_the_file_line(write_recipe, pm):
    text = FILE_RECIPE + "specialization: {prefill_seq_len: 16, ctx_len: 64}\n"
    result = lint_one(write_recipe, pm, text, prompts__txt="def f():\n\n" + "x = 1; " * 80 + "\n")
    finding = [f for f in result.findings if f.code == "SPD109"][0]
    assert located(result, "SPD109") == ["9:9"] and finding.message.startswith("line 3 of prompts.txt has ")


def test_missing_draft_model_is_caught_and_the_hint_names_its_key(write_recipe, pm):
    text = MINIMAL.replace("uses: prompt_lookup", "uses: draft_model\n  with:\n    model: ./no-such-draft")
    result = lint_one(write_recipe, pm, text)
    assert located(result, "SPD111") == ["8:12"]
    finding = [f for f in result.findings if f.code == "SPD111"][0]
    assert "proposer.with.model" in finding.hint and "model.id" not in finding.hint


def test_missing_local_model_is_caught(write_recipe, pm):
    result = lint_one(write_recipe, pm, MINIMAL.replace("spdflow:tinycode-target", "./no-such-model"))
    assert located(result, "SPD111") == ["4:7"] and "is not a directory" in result.findings[0].message


def test_uncached_hub_id_is_caught(write_recipe, pm, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    result = lint_one(write_recipe, pm, MINIMAL.replace("spdflow:tinycode-target", "some-org/some-model"))
    assert located(result, "SPD111") == ["4:7"]
    assert "not in the local Hugging Face cache" in result.findings[0].message


def test_nospec_policy_with_only_positive_k_is_caught(write_recipe, pm):
    result = lint_one(write_recipe, pm, MINIMAL.replace("[0, 4]", "[2, 4]") + "k_policy: nospec\n")
    assert located(result, "SPD105") == ["7:25"] and result.exit_code(strict=False) == 1


def test_count_above_the_prompts_given_warns(write_recipe, pm):
    text = FILE_RECIPE.replace("  max_new_tokens: 8", "  count: 12\n  max_new_tokens: 8")
    result = lint_one(write_recipe, pm, text, prompts__txt="".join(f"def f{i}():\n" for i in range(5)))
    assert located(result, "SPD108") == ["10:10"]
    finding = [f for f in result.findings if f.code == "SPD108"][0]
    assert finding.severity == "warning" and "has 5 prompts; the run uses 5" in finding.message


def test_a_model_without_tokenizer_says_lengths_were_not_checked(write_recipe, pm, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    result = lint_one(write_recipe, pm, MINIMAL.replace("spdflow:tinycode-target", "./m"))
    assert [f.code for f in result.findings] == ["SPD110"]
    assert result.findings[0].severity == "info" and "no tokenizer.json" in result.findings[0].message
    assert result.exit_code(strict=True) == 0


def test_clean_recipe_passes_preflight(write_recipe, pm):
    assert preflight(read_recipe(write_recipe(), pm), pm) == []


# ------------------------------------------------------------------------------- run and --dry-run use the same checks


@pytest.fixture
def runner():
    return CliRunner()


def test_run_stops_before_export_on_a_missing_prompt_file(runner, write_recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_recipe(FILE_RECIPE)
    result = runner.invoke(cli, ["run", str(path)])
    assert result.exit_code == 1
    assert f"{path}:9:9: SPD107 prompt file" in result.stderr and "found before any export" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_run_refuses_nospec_without_k0(runner, write_recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_recipe(MINIMAL.replace("[0, 4]", "[2, 4]") + "k_policy: nospec\n")
    result = runner.invoke(cli, ["run", str(path)])
    assert result.exit_code == 1 and "SPD105 k_policy 'nospec' needs shapes that are not compiled" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_reports_preflight_errors_and_exits_1(runner, write_recipe):
    path = write_recipe(MINIMAL.replace("spdflow:tinycode-target", "./no-such-model"))
    result = runner.invoke(cli, ["run", str(path), "--dry-run"])
    assert result.exit_code == 1
    assert "specializations (" in result.stdout and "preflight: 1 error(s)" in result.stdout
    assert f"{path}:4:7: SPD111" in result.stderr


def test_dry_run_of_a_clean_recipe_says_preflight_is_fine(runner, write_recipe):
    result = runner.invoke(cli, ["run", str(write_recipe()), "--dry-run"])
    assert result.exit_code == 0 and "preflight: everything checkable before export is fine" in result.stdout
