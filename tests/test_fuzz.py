"""Fuzzing the recipe path: whatever the text, load/validate/lint answer with findings, never a crash.

Over 1,000 generated recipes in total (random YAML structures, wrong types, extreme numbers,
unicode, deep nesting, alias bombs, mutations of the real recipes); each must finish within a
second with exit 0, 1 or 3 and only catalogued finding codes. The whole file stays under ~40 s.
"""
from __future__ import annotations

import copy
import re
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spdflow.catalog import ENTRIES
from spdflow.cli import cli
from spdflow.errors import UsageError
from spdflow.lint import lint_paths
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import parse_override, read_recipe

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
CODES = {e.code for e in ENTRIES if e.code.startswith("SPD")}
# No hypothesis deadline: it is wall time, which a shared 2-core machine stretches at random; the
# tests that bound time (alias bombs, billion laughs) assert the loader's CPU time themselves.
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)

_PM = None


def pm():
    """One plugin manager for the module: hypothesis examples cannot take function fixtures."""
    global _PM
    if _PM is None:
        _PM = get_plugin_manager()
    return _PM


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ------------------------------------------------------------------------------- strategies

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
texts = st.one_of(st.text(max_size=30), st.sampled_from(["", "~", "null", "yes", "0x1F", "1e999", ".inf", "2024-01-01",
                                                          "../../etc/passwd", "os.system", "spdflow:tinycode-target"]))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(texts, children, max_size=4)),
    max_leaves=20,
)


def _keys_of(data, prefix=()):
    """Every key path in ``data`` (dicts and lists)."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _keys_of(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _keys_of(value, prefix + (i,))


REAL = [yaml.safe_load(p.read_text()) for p in RECIPES]
REAL_PATHS = [list(_keys_of(d))[1:] for d in REAL]


@st.composite
def mutated_recipes(draw):
    """A real recipe with a few values replaced, keys deleted or unknown keys added."""
    index = draw(st.integers(0, len(REAL) - 1))
    data = copy.deepcopy(REAL[index])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(REAL_PATHS[index]))
        parent = data
        try:
            for part in path[:-1]:
                parent = parent[part]
            action = draw(st.sampled_from(["replace", "delete", "add"]))
            if action == "replace":
                parent[path[-1]] = draw(values)
            elif action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, dict):
                parent[draw(texts)] = draw(values)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation changed the shape; keep what we have
    return yaml.safe_dump(data, allow_unicode=draw(st.booleans()), sort_keys=draw(st.booleans()))


def _typed_field_values():
    """Plausible-but-wrong values for the real schema's fields."""
    return st.fixed_dictionaries({}, optional={
        "version": st.one_of(st.just(1), scalars),
        "name": st.one_of(st.just("ok"), texts),
        "model": st.one_of(st.just({"id": "spdflow:tinycode-target"}), values),
        "proposer": st.one_of(st.just({"uses": "prompt_lookup"}), st.fixed_dictionaries({"uses": texts, "with": values})),
        "num_speculative_tokens": st.one_of(numbers, st.lists(numbers, max_size=5), values),
        "specialization": st.fixed_dictionaries({}, optional={
            "prefill_seq_len": numbers, "ctx_len": numbers, "batch_size": numbers, "full_batch_size": scalars}),
        "devices": st.fixed_dictionaries({}, optional={
            "backend": st.one_of(st.just("onnxruntime"), texts), "device_ids": st.lists(numbers, max_size=3),
            "with": values, "num_cores": numbers}),
        "workload": st.fixed_dictionaries({}, optional={
            "prompts": st.one_of(st.lists(texts, max_size=3), values), "file": texts, "builtin": texts,
            "max_new_tokens": numbers, "temperature": numbers, "top_p": numbers, "count": numbers}),
        "k_policy": st.one_of(texts, st.fixed_dictionaries({"uses": texts}, optional={"with": values})), "acceptance": texts, "output": texts, "extra": values,
    })


def _dump(data) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


typed_recipes = _typed_field_values().map(_dump)
structures = values.map(_dump)
raw_texts = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["version: 1", "name: x", "  - a", "? k", ": v", "&a [1]", "*a", "!!int x", "<<: *a",
                              "{", "}", "[", "]", "'", '"', "\t", "%YAML 1.1", "---", "...", "key: &x {a: *x}",
                              "!tag v", "\ufeff", "\x00", "k: |", "  block"]), max_size=12).map("\n".join),
)


# ------------------------------------------------------------------------------- the property


def check_text(text: str, path: Path) -> None:
    """Load, validate and lint one recipe text: findings only, exit 0/1/3, catalogued codes."""
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    loaded = read_recipe(path, pm())
    for finding in loaded.findings:
        assert finding.code in CODES, finding.render()
        assert finding.message.strip()
    result = lint_paths([str(path)], pm())
    assert result.exit_code(strict=False) in (0, 1, 3)
    assert result.exit_code(strict=False) == 3 or not loaded.errors
    for finding in result.findings:
        assert finding.code in CODES and finding.message.strip()


@settings(FUZZ, max_examples=300)
@given(text=mutated_recipes())
def test_fuzz_mutated_real_recipes(text, workdir):
    check_text(text, workdir / "mutated.yaml")


@settings(FUZZ, max_examples=300)
@given(text=typed_recipes)
def test_fuzz_wrong_types_and_extreme_numbers(text, workdir):
    check_text(text, workdir / "typed.yaml")


@settings(FUZZ, max_examples=250)
@given(text=structures)
def test_fuzz_random_yaml_structures(text, workdir):
    check_text(text, workdir / "structure.yaml")


@settings(FUZZ, max_examples=250)
@given(text=raw_texts)
def test_fuzz_raw_text_and_yaml_syntax(text, workdir):
    check_text(text, workdir / "raw.yaml")


@settings(FUZZ, max_examples=40)
@given(depth=st.integers(30, 5000), kind=st.sampled_from(["[", "{a: ", "- "]))
def test_fuzz_deep_nesting_is_refused(depth, kind, workdir):
    if kind == "- ":
        text = "".join("  " * i + "- \n" for i in range(min(depth, 300)))
    else:
        text = kind * depth
    check_text(text, workdir / "deep.yaml")


def billion_laughs(levels: int, width: int) -> str:
    lines = ["a0: &a0 [lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append(f"version: 1\nbomb: *a{levels - 1}")
    return "\n".join(lines) + "\n"


@settings(FUZZ, max_examples=10)
@given(levels=st.integers(3, 12), width=st.integers(5, 12))
def test_fuzz_alias_bombs_are_refused_quickly_in_bounded_memory(levels, width, workdir):
    path = workdir / "bomb.yaml"
    path.write_text(billion_laughs(levels, width))
    tracemalloc.start()
    # CPU time of this process, not wall time: the bound is about the loader's work (no
    # exponential expansion: 12**12 values would take hours), and wall time on a shared 2-core
    # machine also counts other jobs; 3 s of CPU leaves room for a loaded machine's slower cores
    start = time.process_time()
    try:
        loaded = read_recipe(path, pm())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.process_time() - start < 3.0
    assert peak < 64 * 1024 * 1024
    if width ** (levels - 1) > 20_000:  # the bomb alone expands to width**(levels-1) 'lol' leaves
        assert [f.code for f in loaded.findings] == ["SPD004"]


def test_classic_billion_laughs_is_spd004(workdir):
    path = workdir / "laughs.yaml"
    path.write_text(billion_laughs(9, 10))
    start = time.process_time()  # CPU time: see the alias-bomb test above
    loaded = read_recipe(path, pm())
    assert time.process_time() - start < 3.0
    assert loaded.findings[0].code == "SPD004" and "more than 20000 values" in loaded.findings[0].message


@pytest.mark.parametrize("depth", [41, 999, 1001, 5000])
def test_deep_flow_nesting_is_spd004_at_once(depth, workdir):
    # past libyaml's own limit (1000 levels) the depth check once fell through to PyYAML's
    # pure-Python parse, which is quadratic in depth: 2.4 s of CPU at 5000 '[', twice with lint
    path = workdir / "flow.yaml"
    path.write_text("[" * depth)
    start = time.process_time()
    loaded = read_recipe(path, pm())
    assert time.process_time() - start < 0.5
    assert [(f.code, f.message) for f in loaded.findings] == [("SPD004", "the document is nested deeper than 40 levels")]
    assert loaded.findings[0].location.line == 1


@settings(FUZZ, max_examples=100)
@given(expr=st.text(max_size=40))
def test_fuzz_set_overrides_raise_only_usage_errors(expr):
    try:
        keys, _ = parse_override(expr)
    except UsageError as exc:
        assert exc.exit_code == 2 and exc.message.startswith("--set")
    else:
        assert keys and all(keys)


# ------------------------------------------------------------------------------- through the CLI


@settings(FUZZ, max_examples=25)
@given(text=st.one_of(mutated_recipes(), typed_recipes, raw_texts))
def test_fuzz_cli_lint_and_dry_run_answer_in_one_sentence(text, workdir):
    path = workdir / "cli.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    runner = CliRunner()
    for args in (["lint", str(path)], ["run", "--dry-run", str(path)]):
        result = runner.invoke(cli, args, catch_exceptions=True)
        assert result.exit_code in (0, 1, 3), (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert "Traceback" not in result.output
        if result.exit_code == 3:
            assert re.search(r"SPD0\d\d", result.output)


# ------------------------------------------------------------------------------- strict types

#: integer fields of the recipe (dotted --set paths) and values that only loose coercion would take
INT_FIELDS = ["specialization.batch_size", "specialization.ctx_len", "specialization.prefill_seq_len",
              "workload.count", "workload.max_new_tokens", "workload.seed", "workload.top_k", "num_speculative_tokens"]
LOOSE_INTS = st.one_of(st.booleans(), st.integers(1, 64).map(float), st.integers(1, 64).map(str),
                       st.lists(st.one_of(st.booleans(), st.integers(0, 8).map(str)), min_size=1, max_size=3))


@settings(FUZZ, max_examples=120)
@given(field=st.sampled_from(INT_FIELDS), value=LOOSE_INTS)
def test_fuzz_no_bool_str_or_float_becomes_an_int(field, value, workdir):
    import json as _json

    path = workdir / "strict.yaml"
    if not path.exists():
        path.write_text((REPO / "recipes" / "tinycode_varK.yaml").read_text())
    if field != "num_speculative_tokens" and isinstance(value, list):
        value = value[0]
    loaded = read_recipe(path, pm(), [f"{field}={_json.dumps(value)}"])
    assert loaded.errors, (field, value)
    assert {f.code for f in loaded.errors} <= {"SPD012", "SPD014", "SPD015"}, [f.render() for f in loaded.errors]


@settings(FUZZ, max_examples=80)
@given(word=st.sampled_from(["yes", "no", "on", "off", "y", "n", "Yes", "ON", "1:30", "12:00:01", "0o17", "010"]))
def test_fuzz_yaml_11_words_are_never_booleans_or_sexagesimal(word):
    from spdflow.recipe.yamlsource import parse_yaml

    value = parse_yaml(f"v: {word}", "x").data["v"]
    assert not isinstance(value, bool)
    if ":" in word or word.isalpha():
        assert value == word
