"""Multi-projection proposer (QEfficient "Turbo", Medusa-1): the target proposes for itself.

The target is exported with its multi-projection heads (``speculator_config.json`` +
``speculator.safetensors`` in the model directory), so every verify run returns logits
``[batch, nlk, heads+1, vocab]``: row 0 is the LM head (the engine verifies with it alone),
row ``i`` is head ``i``'s guess of the token ``i`` places after the one row 0 predicts. After a
step the engine hands the proposer the head logits of the committed rows; the last one belongs
to the row that produced the current anchor, so its heads guess the tokens after the anchor.
Proposing costs no model run: greedy argmax per head, stopped at the first head whose top
probability is below ``min_confidence`` (so the K policy can pick a smaller compiled K when the
heads are unsure). Proposals are point masses, so rejection sampling stays exact at T > 0.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import Proposal, ProposeInput, Proposer, Request, TargetOutputs
from spdflow.errors import RecipeError

SPECULATOR_CONFIG = "speculator_config.json"


class MultiProjectionConfig(BaseModel):
    """The ``with:`` block of ``proposer: {uses: multi_projection}``."""

    model_config = ConfigDict(extra="forbid")

    min_confidence: float = Field(
        0.0, ge=0.0, le=1.0,
        description="Stop at the first head whose most likely token has a probability (softmax of "
        "its logits) below this; 0 proposes every head.",
    )
    num_speculative_tokens: int | None = Field(
        None, ge=1, description="Use at most this many heads per step (default: all, within k_max).",
    )


def speculator_heads(model_dir: Path) -> int:
    """``turbo_num_heads`` of the model directory; RecipeError when it has no heads."""
    path = Path(model_dir) / SPECULATOR_CONFIG
    try:
        heads = json.loads(path.read_text(encoding="utf-8"))["turbo_num_heads"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RecipeError(
            f"proposer 'multi_projection' needs {SPECULATOR_CONFIG} (turbo_num_heads, turbo_num_layers) and "
            f"speculator.safetensors in the target's directory {model_dir}, but cannot read them ({exc})",
            hint="train heads with tools/train_heads.py, or use a target that ships them",
        ) from exc
    return int(heads)


class MultiProjectionProposer(Proposer):
    """Greedy proposals from the head logits of the last verified row."""

    name = "multi_projection"
    target_outputs = ("head_logits",)

    def __init__(self, config: MultiProjectionConfig, ctx):
        self.config = config
        self.heads = speculator_heads(ctx.target.source_dir)
        #: slot -> (context length the guesses follow, tokens, top probabilities)
        self._next: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}

    def add_request(self, slot: int, request: Request) -> None:
        self._next.pop(slot, None)

    def on_target_outputs(self, slot: int, outputs: TargetOutputs) -> None:
        if outputs.head_logits is None or not len(outputs.head_logits):
            self._next.pop(slot, None)
            return
        last = outputs.head_logits[-1].astype(np.float32)  # [heads, vocab]
        tokens = last.argmax(axis=-1)
        shifted = last - last.max(axis=-1, keepdims=True)
        top = 1.0 / np.exp(shifted).sum(axis=-1)  # softmax probability of the argmax
        # The guesses follow the token row ``positions[-1]`` produced, at position + 1.
        self._next[slot] = (int(outputs.positions[-1]) + 2, tokens.astype(np.int64), top)

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        proposals = []
        for item in inputs:
            entry = self._next.get(item.slot)
            if entry is None or entry[0] != len(item.tokens):
                proposals.append(Proposal.empty())  # nothing verified for this context yet
                continue
            _, tokens, top = entry
            n = min(item.k_max, len(tokens), self.config.num_speculative_tokens or len(tokens))
            unsure = np.flatnonzero(top[:n] < self.config.min_confidence)
            if len(unsure):
                n = int(unsure[0])
            proposals.append(Proposal(tokens[:n].copy()))
        return proposals

    def remove_request(self, slot: int) -> None:
        self._next.pop(slot, None)
