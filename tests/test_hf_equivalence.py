"""spdflow no-spec greedy on the embedded model gives HF transformers' greedy tokens (same prompt
ids, same stop ids, same max_new_tokens), prompt by prompt, including a prompt longer than one
prefill chunk; a chat-rendered workload too (tiny model with a chat template)."""
from __future__ import annotations

import json

from spdflow.testing.equivalence import compare
from spdflow.testing.fixtures import CODE_PROMPTS, run_in_process, tiny_recipe, write_recipe
from spdflow.zoo import zoo_path

LONG = "\n".join(CODE_PROMPTS)  # several prefill chunks of 16


def test_embedded_model_nospec_greedy_matches_hf_greedy(tmp_path, pm):
    model = zoo_path("spdflow:tinycode-target")
    recipe = tiny_recipe(model, tmp_path / "out", k_list=(0,), prompts=[*CODE_PROMPTS, LONG], max_new_tokens=32)
    recipe["specialization"]["ctx_len"] = 256
    state = run_in_process(pm, write_recipe(tmp_path / "recipe.yaml", recipe), check_lossless=False)
    info = json.loads((tmp_path / "out" / "report.json").read_text())
    assert info["status"] == "ok"
    eos = [0]  # the zoo model's EOS
    summary = compare(state.outputs, model, 32, eos)
    assert len(summary.comparisons) == len(CODE_PROMPTS) + 1
    assert summary.comparisons[-1].prompt_tokens > 16  # chunked prefill exercised
    assert summary.identical == len(summary.comparisons), [
        (c.request, c.first_difference, c.top2_gap) for c in summary.comparisons if not c.identical]


def test_a_changed_token_is_reported_with_its_position_and_gap(tmp_path, pm):
    """The comparison can fail: a tampered output shows where it differs and HF's top-2 gap there."""
    model = zoo_path("spdflow:tinycode-target")
    recipe = tiny_recipe(model, tmp_path / "out", k_list=(0,), prompts=CODE_PROMPTS[:1], max_new_tokens=8)
    state = run_in_process(pm, write_recipe(tmp_path / "recipe.yaml", recipe), check_lossless=False)
    output = dict(state.outputs[0])
    output["tokens"] = list(output["tokens"])
    output["tokens"][3] = (output["tokens"][3] + 1) % 4096
    summary = compare([output], model, 8, [0])
    item = summary.comparisons[0]
    assert not item.identical and item.first_difference == 3 and item.top2_gap is not None
    assert summary.unexplained == [item] or item.near_tie
