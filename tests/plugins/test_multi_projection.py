"""The multi_projection proposer (plugins/spdflow_proposers/multi_projection.py)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spdflow.api import ProposeInput, TargetOutputs
from spdflow.errors import RecipeError
from spdflow.plugins import get_plugin_manager
from spdflow.testing import fixtures
from spdflow_proposers import MultiProjectionConfig, MultiProjectionProposer

VOCAB = 16


def make(tmp_path: Path, heads=3, **config) -> MultiProjectionProposer:
    (tmp_path / "speculator_config.json").write_text(json.dumps({"turbo_num_heads": heads, "turbo_num_layers": 1}))
    ctx = SimpleNamespace(target=SimpleNamespace(source_dir=tmp_path))
    return MultiProjectionProposer(MultiProjectionConfig(**config), ctx)


def head_logits(rows, tokens, confidence=10.0):
    """[rows, heads, VOCAB] whose last row's head i puts ``confidence`` on tokens[i]."""
    logits = np.zeros((rows, len(tokens), VOCAB), dtype=np.float32)
    for i, (t, c) in enumerate(zip(tokens, np.broadcast_to(confidence, len(tokens)))):
        logits[-1, i, t] = c
    return logits


def ask(proposer, length, k_max=7, slot=0):
    item = ProposeInput(slot, 0, np.arange(length, dtype=np.int64), 2, k_max)
    return proposer.propose([item])[0].tokens.tolist()


def test_proposes_the_last_rows_head_argmax_for_the_context_it_follows(tmp_path):
    proposer = make(tmp_path)
    # a decode step committed rows at positions 9, 10, 11: row 11 produced token 12, the anchor
    proposer.on_target_outputs(0, TargetOutputs(np.array([9, 10, 11]), head_logits(3, [4, 5, 6])))
    assert ask(proposer, 13) == [4, 5, 6]
    assert ask(proposer, 13, k_max=2) == [4, 5]
    assert ask(proposer, 12) == [] and ask(proposer, 14) == []  # any other context: nothing


def test_min_confidence_cuts_at_the_first_unsure_head(tmp_path):
    proposer = make(tmp_path, min_confidence=0.5)
    logits = head_logits(1, [4, 5, 6], confidence=np.array([20.0, 1.0, 20.0]))
    proposer.on_target_outputs(0, TargetOutputs(np.array([11]), logits))
    assert ask(proposer, 13) == [4]


def test_num_speculative_tokens_caps_the_heads_used(tmp_path):
    proposer = make(tmp_path, num_speculative_tokens=1)
    proposer.on_target_outputs(0, TargetOutputs(np.array([11]), head_logits(1, [4, 5, 6])))
    assert ask(proposer, 13) == [4]


def test_slots_are_independent_and_forgotten_on_remove(tmp_path):
    proposer = make(tmp_path)
    proposer.on_target_outputs(1, TargetOutputs(np.array([11]), head_logits(1, [4, 5, 6])))
    assert ask(proposer, 13, slot=0) == []
    assert ask(proposer, 13, slot=1) == [4, 5, 6]
    proposer.remove_request(1)
    assert ask(proposer, 13, slot=1) == []


def test_target_without_heads_is_a_recipe_error_naming_the_tool(tmp_path):
    ctx = SimpleNamespace(target=SimpleNamespace(source_dir=tmp_path))
    with pytest.raises(RecipeError, match="speculator_config.json") as info:
        MultiProjectionProposer(MultiProjectionConfig(), ctx)
    assert "train_heads" in info.value.hint


def test_registered_class_declares_the_target_outputs_it_reads():
    registration = get_plugin_manager().lookup("proposer", "multi_projection")
    assert registration.factory.target_outputs == ("head_logits",)


def test_output_equals_greedy_decoding_of_the_plain_target(tmp_path, tiny_speculator_model_dir):
    """Lossless against the target exported WITHOUT heads: the engine verifies with row 0."""
    pm = fixtures.fresh_plugin_manager()
    prompts = fixtures.CODE_PROMPTS[:2]
    plain = fixtures.tiny_recipe(tiny_speculator_model_dir, tmp_path / "plain", prompts=prompts, max_new_tokens=24,
                                 k_list=(0,), k_policy="nospec")
    spec = fixtures.tiny_recipe(tiny_speculator_model_dir, tmp_path / "spec", prompts=prompts, max_new_tokens=24,
                                proposer={"uses": "multi_projection"}, k_list=(0, 1, 3))
    base = fixtures.run_in_process(pm, fixtures.write_recipe(tmp_path / "plain.yaml", plain), check_lossless=False)
    state = fixtures.run_in_process(pm, fixtures.write_recipe(tmp_path / "spec.yaml", spec))
    assert [o["tokens"] for o in state.outputs] == [o["tokens"] for o in base.outputs]
    steps = [r for r in state.records if r.get("kind") == "step"]
    assert sum(sum(row["proposed"] for row in s["rows"]) for s in steps) > 0
