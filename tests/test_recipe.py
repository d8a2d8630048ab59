"""Recipe loading: every bad recipe gets a located, coded, one-line finding."""
from __future__ import annotations

import pytest

from spdflow.errors import RecipeError, UsageError
from spdflow.recipe.loader import load_recipe, read_recipe

from conftest import MINIMAL

BAD = [
    # (recipe text, code, line, col, message fragment)
    ("version: 1\nname: t\nmodel:\n  id: x\n  dtyp: float32\n", "SPD010", 5, 3, "did you mean 'dtype'"),
    ("version: 2\nname: t\nmodel: {id: x}\n", "SPD013", 1, 10, "version"),
    ("version: 1\nname: t\n", "SPD011", 1, 1, "missing required key 'model'"),
    ("version: 1\nname: t\nmodel: {id: x}\nnum_speculative_tokens: [0, -1]\n", "SPD015", 4, 25, "between 0 and 64"),
    ("version: 1\nname: t\nmodel: {id: x}\nnum_speculative_tokens: four\n", "SPD012", 4, 25, "num_speculative_tokens"),
    ("version: 1\nname: t\nmodel: {id: x}\nname: u\n", "SPD002", 4, 1, "duplicate key 'name'"),
    ("version: 1\nname: t\nmodel: !!python/object:os.system {id: x}\n", "SPD003", 3, 8, "unsupported YAML tag"),
    ("version: 1\nname: [\n", "SPD001", 3, 1, "invalid YAML"),
    ("version: 1\nname: 'bad name!'\nmodel: {id: x}\n", "SPD016", 2, 7, "name"),
    ("version: 1\nname: t\nmodel: {id: x}\nproposer: {uses: prompt_lokup}\nnum_speculative_tokens: 3\n",
     "SPD020", 4, 18, "did you mean 'prompt_lookup'"),
    ("version: 1\nname: t\nmodel: {id: x}\ndevices: {backend: qiac}\n", "SPD021", 4, 20, "did you mean 'qaic'"),
    ("version: 1\nname: t\nmodel: {id: x}\nk_policy: smalest_covering\n", "SPD022", 4, 11, "did you mean 'smallest_covering'"),
    ("version: 1\nname: t\nmodel: {id: x}\nproposer: {uses: prompt_lookup}\nnum_speculative_tokens: [0, 40]\n",
     "SPD030", 1, 1, "prefill_seq_len 32 is smaller than max(K)+1 = 41"),
    ("version: 1\nname: t\nmodel: {id: x}\nspecialization: {prefill_seq_len: 64, ctx_len: 64}\n", "SPD031", 4, 48, "ctx_len 64"),
    ("version: 1\nname: t\nmodel: {id: x}\nspecialization: {batch_size: 4, full_batch_size: 2}\n", "SPD032", 4, 50, "full_batch_size 2"),
    ("version: 1\nname: t\nmodel: {id: x}\ndevices: {device_ids: [0, 1, 1]}\n", "SPD033", 4, 30, "device 1 is listed twice"),
    ("version: 1\nname: t\nmodel: {id: x}\nworkload: {builtin: code, max_new_tokens: 600}\n", "SPD034", 4, 43, "max_new_tokens 600"),
    ("version: 1\nname: t\nmodel: {id: x}\nworkload: {builtin: code, prompts: [a]}\n", "SPD035", 4, 11, "2 ways"),
    ("version: 1\nname: t\nmodel: {id: x}\nnum_speculative_tokens: 4\n", "SPD036", 4, 25, "no proposer"),
    ("version: 1\nname: t\nmodel: {id: x}\nacceptance: greedy\nworkload: {builtin: code, temperature: 0.7}\n",
     "SPD037", 4, 13, "greedy"),
    ("version: 1\nname: t\nmodel: {id: x}\nproposer: {uses: prompt_lookup, with: {prompt_lookup_maxx: 3}}\n"
     "num_speculative_tokens: [0, 3]\n", "SPD010", 4, 40, "did you mean 'prompt_lookup_max'"),
    ("- a\n- b\n", "SPD012", 1, 1, "must be a YAML mapping"),
    ("version: 1\nname: t\nmodel: {id: x}\ndevices: {backend: onnxruntime, threads: 2}\n", "SPD010", 4, 33,
     "devices.threads moved to devices.with.threads"),
    ("version: 1\nname: t\nmodel: {id: x}\ndevices:\n  backend: qaic\n  mxfp6_matmul: true\n", "SPD010", 6, 3,
     "devices.mxfp6_matmul moved to devices.with.mxfp6_matmul"),
    ("version: 1\nname: t\nmodel: {id: x}\ndevices: {backend: qaic, with: {num_cors: 4}}\n", "SPD010", 4, 33,
     "did you mean 'num_cores'"),
    ("version: 1\nname: t\nmodel: {id: x}\ndevices: {backend: onnxruntime, with: {threads: 0}}\n", "SPD014", 4, 49,
     "devices.with.threads"),
    ("version: 1\nname: t\nmodel: {id: x}\nk_policy: {uses: goodput, with: {margn: 0.2}}\n", "SPD010", 4, 34,
     "did you mean 'margin'"),
    ("version: 1\nname: t\nmodel: {id: x}\nk_policy: {uses: smalest_covering}\n", "SPD022", 4, 18,
     "did you mean 'smallest_covering'"),
    ("version: 1\nname: t\nmodel: {id: x}\nk_policy: {uses: fixed, with: {k: 2}}\n", "SPD010", 4, 32,
     "k policy 'fixed' takes no settings"),
]


@pytest.mark.parametrize("text, code, line, col, fragment", BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_recipe_is_located_and_coded(write_recipe, pm, text, code, line, col, fragment):
    loaded = read_recipe(write_recipe(text), pm)
    matches = [f for f in loaded.errors if f.code == code]
    assert matches, [f.render() for f in loaded.findings]
    finding = matches[0]
    assert fragment in finding.message
    if code != "SPD030":  # the prefill check points at the prefill key, absent here: nearest parent
        assert (finding.location.line, finding.location.col) == (line, col), finding.render()


def test_all_errors_reported_at_once(write_recipe, pm):
    text = "version: 1\nname: t\nmodel:\n  id: x\n  dtyp: f\ndevices: {backend: qiac, device_ids: []}\n"
    loaded = read_recipe(write_recipe(text), pm)
    codes = sorted(f.code for f in loaded.errors)
    assert codes == ["SPD010", "SPD014", "SPD021"]


def test_load_recipe_raises_one_error_with_every_finding(write_recipe, pm):
    path = write_recipe("version: 1\nname: t\nmodel: {id: x, dtyp: f}\nk_policy: nope\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, pm)
    assert info.value.exit_code == 3
    assert "2 errors" in info.value.message


def test_billion_laughs_is_refused_quickly(write_recipe, pm):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i-1}"] * 10) + "]")
    loaded = read_recipe(write_recipe("\n".join(lines) + "\n"), pm)
    assert [f.code for f in loaded.errors] == ["SPD004"]


def test_int_means_one_k(write_recipe, pm):
    loaded = load_recipe(write_recipe(MINIMAL.replace("[0, 4]", "3")), pm)
    assert loaded.recipe.k_list() == [3]


def test_override_is_validated_and_named(write_recipe, pm):
    path = write_recipe()
    loaded = load_recipe(path, pm, ["num_speculative_tokens=[0,2,4]", "devices.backend=qaic"])
    assert loaded.recipe.k_list() == [0, 2, 4] and loaded.recipe.devices.backend == "qaic"
    bad = read_recipe(path, pm, ["devices.backend=qiac"])
    assert bad.errors[0].location.source == "--set devices.backend=qiac"
    assert "did you mean 'qaic'" in bad.errors[0].message


def test_malformed_override_is_a_usage_error(write_recipe, pm):
    with pytest.raises(UsageError):
        read_recipe(write_recipe(), pm, ["num_speculative_tokens"])


def test_plugin_settings_are_validated_by_the_plugin_model(write_recipe, pm):
    from spdflow_decoding import GoodputConfig
    from spdflow_ort.config import OrtConfig

    text = ("version: 1\nname: t\nmodel: {id: x}\nproposer: {uses: prompt_lookup}\nnum_speculative_tokens: [0, 4]\n"
            "k_policy: {uses: goodput, with: {margin: 0.25}}\ndevices: {backend: onnxruntime, with: {threads: 2}}\n")
    loaded = load_recipe(write_recipe(text), pm)
    assert loaded.k_policy_config == GoodputConfig(margin=0.25)
    assert loaded.backend_config == OrtConfig(threads=2)
    assert loaded.recipe.k_policy.uses == "goodput"


def test_a_bare_k_policy_name_means_uses(write_recipe, pm):
    loaded = load_recipe(write_recipe(MINIMAL + "k_policy: goodput\n"), pm)
    assert loaded.recipe.k_policy.uses == "goodput" and loaded.recipe.k_policy.with_ == {}


def test_missing_file_is_a_finding_not_an_exception(tmp_path, pm):
    loaded = read_recipe(tmp_path / "nope.yaml", pm)
    assert loaded.errors[0].code == "SPD000"


def test_every_schema_field_has_a_description():
    from pydantic import BaseModel

    from spdflow.recipe import schema

    for model in vars(schema).values():
        if isinstance(model, type) and issubclass(model, BaseModel) and model is not BaseModel and model.model_fields:
            for name, info in model.model_fields.items():
                assert info.description, f"{model.__name__}.{name} has no description"


# ------------------------------------------------------------------------------- strict input


LOOSE = [
    # (--set override, the path named in the SPD012 finding)
    ("version=true", "version"),
    ("specialization.batch_size=true", "specialization.batch_size"),
    ("specialization.batch_size=1.0", "specialization.batch_size"),
    ("num_speculative_tokens=['1','2']", "num_speculative_tokens.0"),
    ("num_speculative_tokens=[true]", "num_speculative_tokens.0"),
    ("workload.max_new_tokens='8'", "workload.max_new_tokens"),
    ("workload.ignore_eos=1", "workload.ignore_eos"),
    ("proposer.with.prompt_lookup_max=true", "proposer.with.prompt_lookup_max"),
]


@pytest.mark.parametrize("override,where", LOOSE, ids=[o for o, _ in LOOSE])
def test_no_loose_coercion_of_bools_strings_or_floats(write_recipe, pm, override, where):
    loaded = read_recipe(write_recipe(), pm, [override])
    assert [f.code for f in loaded.errors] and {f.code for f in loaded.errors} <= {"SPD012", "SPD014"}, loaded.findings
    assert any(f.message.startswith(where) for f in loaded.errors), [f.message for f in loaded.errors]


YAML12 = [
    # (YAML value of workload.prompts[0], the string it must stay)
    ("yes", "yes"), ("on", "on"), ("No", "No"), ("y", "y"), ("1:30", "1:30"), ("2024-01-01", "2024-01-01"),
]


@pytest.mark.parametrize("text,expected", YAML12, ids=[t for t, _ in YAML12])
def test_yaml_12_core_scalars_keep_yes_on_and_sexagesimal_as_strings(write_recipe, pm, text, expected):
    loaded = load_recipe(write_recipe(MINIMAL.replace('prompts: ["def f(x):"]', f"prompts: [{text}]")), pm)
    assert loaded.recipe.workload.prompts == [expected]


def test_yaml_12_core_numbers(write_recipe, pm):
    from spdflow.recipe.yamlsource import parse_yaml

    data = parse_yaml("a: 010\nb: 0o17\nc: 0x1F\nd: 1e3\ne: true\nf: ~\ng: 1_000\n", "x").data
    assert data == {"a": 10, "b": 15, "c": 31, "d": 1000.0, "e": True, "f": None, "g": "1_000"}
    loaded = read_recipe(write_recipe(MINIMAL.replace("max_new_tokens: 8", "max_new_tokens: 1:30")), pm)
    assert any(f.code == "SPD012" and "max_new_tokens" in f.message for f in loaded.errors)  # not 90


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_recipe_that_is_not_a_regular_file_is_refused_without_hanging(tmp_path, pm, kind):
    import os
    import time

    path = {"fifo": tmp_path / "r.yaml", "device": __import__("pathlib").Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    started = time.monotonic()
    loaded = read_recipe(path, pm)
    assert time.monotonic() - started < 5
    assert loaded.findings[0].code == "SPD000"
    assert {"fifo": "is a FIFO", "device": "is a device", "directory": "is a directory"}[kind] in loaded.findings[0].message


def test_lint_of_a_fifo_answers_at_once(tmp_path, pm):
    import os

    from spdflow.lint import lint_paths

    os.mkfifo(tmp_path / "r.yaml")
    result = lint_paths([str(tmp_path / "r.yaml")], pm)
    assert result.exit_code(strict=False) == 3 and "is a FIFO" in result.findings[0].message


def test_set_into_an_absent_section_merges_with_its_defaults(write_recipe, pm):
    text = "version: 1\nname: t\nmodel: {id: spdflow:tinycode-target}\n"
    loaded = load_recipe(write_recipe(text), pm, ["workload.max_new_tokens=8", "specialization.ctx_len=256"])
    assert loaded.recipe.workload.builtin == "code" and loaded.recipe.workload.max_new_tokens == 8
    assert loaded.recipe.specialization.ctx_len == 256 and loaded.recipe.specialization.prefill_seq_len == 32


@pytest.mark.parametrize("override,where", [
    ("devices.with.threads=1000000", "devices.with.threads"),  # ONNX Runtime would try to start them all
    ("devices.device_ids=[-1]", "devices.device_ids.0"),
    ("specialization.ctx_len=100000000000", "specialization.ctx_len"),
    ("specialization.batch_size=1000000", "specialization.batch_size"),
])
def test_numbers_that_reach_the_os_are_bounded(write_recipe, pm, override, where):
    loaded = read_recipe(write_recipe(), pm, [override])
    assert any(f.code == "SPD014" and f.message.startswith(where) for f in loaded.errors), [f.render() for f in loaded.findings]


class _Greedyish:
    """Third-party acceptors: one lossless only at temperature 0, one that declares nothing."""

    lossless_at = "zero"

    def accept(self, logits, rows, sampling):
        raise NotImplementedError


class _Undeclared(_Greedyish):
    lossless_at = None


def _with_acceptors(pm):
    from spdflow.hookspecs import hookimpl

    class Acceptors:
        @hookimpl
        def spdflow_register_acceptors(self, register):
            register("my_greedy", _Greedyish)
            register("mystery", _Undeclared)

    pm.add_plugin(Acceptors(), "third_party_acceptors")
    return pm


@pytest.mark.parametrize("temperature, expected", [(0.0, "greedy"), (0.7, "rejection")])
def test_acceptance_auto_asks_the_acceptors_which_is_lossless(write_recipe, pm, temperature, expected):
    from spdflow.plugins import resolve_acceptance

    _with_acceptors(pm)  # a third party's greedy-only acceptor does not displace spdflow's own
    text = f"version: 1\nname: t\nmodel: {{id: x}}\nworkload: {{builtin: code, temperature: {temperature}}}\n"
    loaded = read_recipe(write_recipe(text), pm)
    assert not [f for f in loaded.errors if f.code == "SPD037"]
    assert resolve_acceptance(pm, loaded.recipe) == expected


@pytest.mark.parametrize("acceptance, found", [("my_greedy", True), ("mystery", False), ("rejection", False)])
def test_spd037_names_the_acceptor_the_recipe_chose(write_recipe, pm, acceptance, found):
    _with_acceptors(pm)
    text = f"version: 1\nname: t\nmodel: {{id: x}}\nacceptance: {acceptance}\nworkload: {{builtin: code, temperature: 0.7}}\n"
    findings = [f for f in read_recipe(write_recipe(text), pm).errors if f.code == "SPD037"]
    assert bool(findings) == found
    if found:
        assert "acceptance 'my_greedy' with temperature 0.7 would change the output distribution" in findings[0].render()
        assert "use acceptance: auto (rejection at this temperature)" in findings[0].render()


def test_spd037_when_auto_finds_no_lossless_acceptor(write_recipe):
    from spdflow.errors import PluginError
    from spdflow.plugins import get_plugin_manager, resolve_acceptance

    pm = _with_acceptors(get_plugin_manager(load_entry_points=False))  # no spdflow_decoding: no rejection
    loaded = read_recipe(write_recipe("version: 1\nname: t\nmodel: {id: x}\nworkload: {builtin: code, temperature: 0.7}\n"), pm)
    assert [f.message for f in loaded.errors if f.code == "SPD037"] == [
        "acceptance auto finds no installed acceptor that keeps the output distribution at temperature 0.7"]
    with pytest.raises(PluginError, match="no installed acceptor keeps the output distribution"):
        resolve_acceptance(pm, loaded.recipe)
