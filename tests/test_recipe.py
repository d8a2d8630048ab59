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
