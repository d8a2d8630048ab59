"""spdflow lint: rules, formats, exit codes, and no heavy imports."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from spdflow.lint import lint_paths, render

from conftest import MINIMAL, REPO


def codes(result):
    return [f.code for f in result.findings]


def test_clean_recipe_has_no_findings(write_recipe, pm):
    result = lint_paths([str(write_recipe())], pm)
    assert codes(result) == [] and result.exit_code(strict=True) == 0


def test_unsorted_and_duplicate_k_are_warnings(write_recipe, pm):
    result = lint_paths([str(write_recipe(MINIMAL.replace("[0, 4]", "[4, 0, 4]")))], pm)
    assert codes(result) == ["SPD101", "SPD102"]
    assert result.exit_code(strict=False) == 0 and result.exit_code(strict=True) == 1


def test_missing_k0_warns_when_proposer_may_propose_nothing(write_recipe, pm):
    result = lint_paths([str(write_recipe(MINIMAL.replace("[0, 4]", "[2, 4]")))], pm)
    assert codes(result) == ["SPD103"]


def test_nospec_policy_without_k0_is_a_shape_coverage_error(write_recipe, pm):
    text = MINIMAL.replace("[0, 4]", "[4]") + "k_policy: nospec\n"
    result = lint_paths([str(write_recipe(text))], pm)
    assert "SPD105" in codes(result) and result.exit_code(strict=False) == 1


def test_qaic_backend_without_sdk_is_a_warning(write_recipe, pm):
    result = lint_paths([str(write_recipe(MINIMAL + "devices: {backend: qaic}\n"))], pm)
    assert codes(result) == ["SPD104"] and result.exit_code(strict=False) == 0


def test_invalid_recipe_exits_3(write_recipe, pm):
    result = lint_paths([str(write_recipe(MINIMAL.replace("name: t", "nam: t")))], pm)
    assert result.exit_code(strict=False) == 3


def test_directories_and_globs_expand(tmp_path, pm, write_recipe):
    write_recipe(name="a.yaml")
    write_recipe(name="b.yml")
    assert len(lint_paths([str(tmp_path)], pm).files) == 2
    assert len(lint_paths([str(tmp_path / "*.yaml")], pm).files) == 1


def test_github_format_is_workflow_commands(write_recipe, pm):
    result = lint_paths([str(write_recipe(MINIMAL.replace("[0, 4]", "[4, 0]")))], pm)
    line = render(result, "github").splitlines()[0]
    assert line.startswith("::warning file=") and ",line=7,col=25,title=SPD101::" in line


def test_json_format_round_trips(write_recipe, pm):
    result = lint_paths([str(write_recipe(MINIMAL.replace("[0, 4]", "[4, 0]")))], pm)
    data = json.loads(render(result, "json"))
    assert data["findings"][0]["code"] == "SPD101" and data["findings"][0]["severity"] == "warning"


def test_shipped_recipes_lint_clean(pm):
    result = lint_paths([str(REPO / "recipes")], pm)
    assert [f for f in result.findings if f.severity == "error"] == []
    assert result.exit_code(strict=False) == 0


def test_lint_imports_no_ml_framework():
    code = (
        "import sys\n"
        "from spdflow.cli import cli\n"
        "try:\n"
        f"    cli(['lint', {str(REPO / 'recipes')!r}], standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'onnxruntime', 'onnx', 'matplotlib') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    elapsed = time.perf_counter() - start
    assert "HEAVY=\n" in out, out
    assert elapsed < 10  # generous: the < 1 s target is measured by the lint timing in the README
