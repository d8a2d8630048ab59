"""The sweep file: schema, keys with did-you-mean, include/exclude, points checked like recipes."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from spdflow.cli import cli
from spdflow.lint import lint_paths
from spdflow.sweep.spec import read_sweep

REPO = Path(__file__).resolve().parents[2]

BASE = """\
version: 1
name: base
model: {id: spdflow:tinycode-target}
proposer: {uses: prompt_lookup}
num_speculative_tokens: [0, 2]
workload: {prompts: ["def f(x):"], max_new_tokens: 8}
"""


def write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def base(tmp_path):
    return write(tmp_path, BASE, "base.yaml")


def codes(loaded):
    return [f.code for f in loaded.findings]


def test_matrix_expands_to_the_cross_product_in_file_order(tmp_path, base, pm):
    path = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix:
          proposer.uses: [prompt_lookup, suffix]
          num_speculative_tokens: [[0, 2], [0, 4], [0, 7]]
        """)
    loaded = read_sweep(path, pm)
    assert loaded.errors == []
    assert [p.label() for p in loaded.points][:3] == [
        "proposer.uses=prompt_lookup, num_speculative_tokens=[0,2]",
        "proposer.uses=prompt_lookup, num_speculative_tokens=[0,4]",
        "proposer.uses=prompt_lookup, num_speculative_tokens=[0,7]"]
    assert len(loaded.points) == 6
    recipes = [p.loaded.recipe for p in loaded.points]
    assert {(r.proposer.uses, tuple(r.k_list())) for r in recipes} == {
        (u, k) for u in ("prompt_lookup", "suffix") for k in ((0, 2), (0, 4), (0, 7))}
    # each point gets its own name and output dir; the base's other keys stay
    assert len({r.name for r in recipes}) == 6
    assert all(r.output.endswith(f"points/{p.id}") for r, p in zip(recipes, loaded.points))
    assert all(r.workload.max_new_tokens == 8 for r in recipes)


def test_exclude_drops_matching_points_and_include_adds_points(tmp_path, base, pm):
    path = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        set: {workload.max_new_tokens: 6}
        matrix:
          proposer.uses: [prompt_lookup, suffix]
          num_speculative_tokens: [[0, 2], [0, 4]]
        exclude:
          - {proposer.uses: suffix, num_speculative_tokens: [0, 4]}
        include:
          - {proposer: null, num_speculative_tokens: 0}
        """)
    loaded = read_sweep(path, pm)
    assert loaded.errors == []
    labels = [p.label() for p in loaded.points]
    assert "proposer.uses=suffix, num_speculative_tokens=[0,4]" not in labels
    assert labels[-1] == "proposer=none, num_speculative_tokens=0"
    assert len(labels) == 4
    assert all(p.loaded.recipe.workload.max_new_tokens == 6 for p in loaded.points)
    assert loaded.points[-1].loaded.recipe.proposer is None


def test_unknown_matrix_key_is_located_with_a_suggestion(tmp_path, base, pm):
    path = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix:
          num_speculative_token: [[0, 2]]
          specialization.batch_sise: [1]
        """)
    loaded = read_sweep(path, pm)
    rendered = [f.render() for f in loaded.errors]
    assert any(r.startswith(f"{path}:5:3: SPD301 unknown key 'num_speculative_token' in the recipe; "
                            "did you mean 'num_speculative_tokens'?") for r in rendered), rendered
    assert any(r.startswith(f"{path}:6:3: SPD301 unknown key 'batch_sise' in specialization; did you mean 'batch_size'?")
               for r in rendered), rendered
    assert loaded.points == []


def test_a_bad_point_is_reported_at_the_matrix_value_it_came_from(tmp_path, base, pm):
    path = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix:
          num_speculative_tokens: [[0, 2], [0, 70]]
        """)
    loaded = read_sweep(path, pm)
    assert [f.code for f in loaded.errors] == ["SPD015"]  # K must be between 0 and 64
    error = loaded.errors[0]
    assert (error.location.source, error.location.line, error.location.col) == (str(path), 5, 36)  # the matrix value [0, 70]
    assert error.message.startswith("point 0-70-") and "70" in error.message


def test_base_recipe_findings_point_into_the_base_file(tmp_path, pm):
    write(tmp_path, BASE.replace("max_new_tokens: 8", "max_new_tokens: 8, count: 0"), "base.yaml")
    path = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix: {num_speculative_tokens: [[0, 2], [0, 4]]}
        """)
    loaded = read_sweep(path, pm)
    error = next(f for f in loaded.errors if f.code == "SPD014")
    assert error.location.source == str(tmp_path / "base.yaml") and error.location.line == 6
    assert error.message.startswith("all 2 points: ")


def test_sweep_sets_name_and_output_itself(tmp_path, base, pm):
    path = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix: {output: [a, b]}
        """)
    assert "SPD305" in codes(read_sweep(path, pm))


def test_missing_base_and_bad_sweep_schema(tmp_path, pm):
    path = write(tmp_path, """\
        version: 1
        name: s
        base: nowhere.yaml
        matrix: {num_speculative_tokens: [[0, 2]]}
        """)
    assert codes(read_sweep(path, pm)) == ["SPD303"]
    path = write(tmp_path, """\
        version: 1
        name: s
        base: nowhere.yaml
        matrx: {num_speculative_tokens: [[0, 2]]}
        """)
    finding = read_sweep(path, pm).findings[0]
    assert finding.code == "SPD010" and "did you mean 'matrix'" in finding.message


def test_inline_base_resolves_relative_paths_against_the_sweep_file(tmp_path, pm):
    (tmp_path / "prompts.txt").write_text("def f(x):\n")
    path = write(tmp_path, """\
        version: 1
        name: s
        base:
          version: 1
          name: b
          model: {id: spdflow:tinycode-target}
          proposer: {uses: prompt_lookup}
          workload: {file: prompts.txt, count: 1, max_new_tokens: 4}
        matrix: {num_speculative_tokens: [[0, 2], [0, 3]]}
        """)
    loaded = read_sweep(path, pm)
    assert loaded.errors == []
    assert loaded.points[0].loaded.base_dir == tmp_path.resolve()


def test_duplicate_points_run_once_with_a_warning(tmp_path, base, pm):
    path = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix: {num_speculative_tokens: [[0, 2], [0, 4]]}
        include: [{num_speculative_tokens: [0, 4]}]
        exclude: [{num_speculative_tokens: [0, 9]}]
        """)
    loaded = read_sweep(path, pm)
    assert len(loaded.points) == 2
    assert sorted(f.code for f in loaded.findings if f.severity == "warning") == ["SPD306", "SPD309"]


def test_lint_checks_sweep_files_and_the_shipped_one_is_clean(tmp_path, base, pm):
    result = lint_paths([str(REPO / "recipes" / "sweeps")], pm)
    assert result.exit_code(strict=True) == 0, [f.render() for f in result.findings]
    bad = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix: {k_polcy: [fixed]}
        """)
    result = lint_paths([str(bad)], pm)
    assert result.exit_code(strict=False) == 3
    # lint rules run on every point: fixed policy with several K (SPD106) is a warning
    fixed = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix: {k_policy: [fixed, smallest_covering]}
        """, "fixed.yaml")
    result = lint_paths([str(fixed)], pm)
    assert [f.code for f in result.findings] == ["SPD106"] and result.exit_code(strict=False) == 0


def test_cli_dry_run_lists_points_and_invalid_sweep_exits_3(tmp_path, base):
    runner = CliRunner()
    result = runner.invoke(cli, ["sweep", str(REPO / "recipes" / "sweeps" / "tinycode_klists.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "6 points" in lines[0]
    assert sum("proposer=suffix" in line for line in lines) == 3
    bad = write(tmp_path, """\
        version: 1
        name: s
        base: base.yaml
        matrix: {num_speculative_token: [[0, 2]]}
        """)
    result = runner.invoke(cli, ["sweep", str(bad)])
    assert result.exit_code == 3
    assert "SPD301" in result.stderr and "did you mean 'num_speculative_tokens'" in result.stderr
    result = runner.invoke(cli, ["sweep", str(bad), "--address", "auto"])
    assert result.exit_code == 2 and "--address is for --executor ray" in result.stderr


def test_committed_sweep_schema_is_current_and_the_shipped_sweep_follows_it():
    import json

    import jsonschema
    import yaml

    committed = json.loads((REPO / "docs" / "sweep.schema.json").read_text())
    assert committed == json.loads(CliRunner().invoke(cli, ["schema", "--sweep"]).stdout), \
        "run: spdflow schema --sweep -o docs/sweep.schema.json"
    shipped = yaml.safe_load((REPO / "recipes" / "sweeps" / "tinycode_klists.yaml").read_text())
    jsonschema.Draft202012Validator(committed).validate(shipped)
    errors = list(jsonschema.Draft202012Validator(committed).iter_errors({**shipped, "matrx": {}}))
    assert errors and "matrx" in errors[0].message
