"""A proposer with a chosen acceptance rate, for performance modelling.

It answers "what would a proposer with per-token acceptance a and proposal rate r buy on this
hardware?" without the proposer existing — the idea of TRT-LLM's
``TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS``, but lossless: proposals are built from the
target's own greedy no-spec continuation (``ctx.reference_output``), each proposed token equal to
the reference with probability ``acceptance_rate`` (else a uniformly drawn other token id), so
greedy verification keeps the output exact while the accepted lengths follow the configured
rates: a step keeps j tokens with probability a^j (1 - a).

The draws belong to positions, not to calls: for each request, position p of its continuation
has one uniform draw (is the proposed token right?), one wrong token and, with
``proposal_rate`` < 1, one draw for whether a step starting at p proposes. A proposal for
positions p..p+k-1 reads those, so what a step accepts depends only on where it starts and on
K, never on how many tokens earlier calls asked for. Two runs of one workload that verify the
same K from the same position therefore see the same outcome (common random numbers): a K
policy compared with fixed K is not also compared with a different draw of luck. (Until 27 Nov
each call drew ``k_max`` values from the request's stream, so a policy drafting 7 tokens and
verifying 2 walked another random path than fixed K=2: at batch 8, acceptance 0.6, one such
path took 142 steps where fixed K=2's took 137.)

At temperature > 0 the generated text leaves the greedy reference and proposals are rejected
more often than configured; use it with greedy workloads.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import Proposal, ProposeInput, Proposer, Request
from spdflow.errors import StageError


class SyntheticConfig(BaseModel):
    """The ``with:`` block of ``proposer: {uses: synthetic}``."""

    model_config = ConfigDict(extra="forbid")

    acceptance_rate: float = Field(
        0.7, ge=0.0, le=1.0,
        description="Probability that each proposed token equals the target's greedy token, "
        "independently per token.",
    )
    proposal_rate: float = Field(
        1.0, ge=0.0, le=1.0,
        description="Probability that a request proposes at all in a step (0: never proposes).",
    )
    seed: int = Field(0, ge=0, description="Seed; each request draws from its own stream.")


class SyntheticProposer(Proposer):
    """Proposals drawn around the reference continuation; see the module docstring."""

    name = "synthetic"
    needs_reference_output = True

    def __init__(self, config: SyntheticConfig, reference_output, vocab_size: int):
        self.config = config
        self.reference_output = reference_output
        self.vocab_size = vocab_size
        self.may_propose_nothing = config.proposal_rate < 1.0
        #: per slot: (the token proposed at each position, whether a step starting there proposes or None)
        self.draws: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}

    def add_request(self, slot: int, request: Request) -> None:
        # The slot's draws are made at its first proposal (a fraction of a ms), seeded by the
        # request, not the slot, so a request's proposals do not depend on its batch.
        self.draws.pop(slot, None)

    def remove_request(self, slot: int) -> None:
        self.draws.pop(slot, None)

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        return [self._propose_one(item) for item in inputs]

    def _propose_one(self, item: ProposeInput) -> Proposal:
        if item.k_max <= 0 or self.config.proposal_rate <= 0:
            return Proposal.empty()
        drafted, proposes = self._draws(item)
        position = len(item.tokens) - item.num_prompt_tokens  # next generated index
        if position >= len(drafted) or (proposes is not None and not proposes[position]):
            return Proposal.empty()
        return Proposal(drafted[position : position + item.k_max].copy())

    def _draws(self, item: ProposeInput):
        """The request's per-position draws (see the module docstring), made on first use."""
        draws = self.draws.get(item.slot)
        if draws is None:
            reference = np.asarray(self.reference_output(item.request_index), dtype=np.int64)
            rng = np.random.default_rng([self.config.seed, item.request_index])
            n = len(reference)
            right = rng.random(n) < self.config.acceptance_rate
            # A wrong token: uniform over the other V-1 ids (shift past the true id).
            wrong = rng.integers(0, self.vocab_size - 1, size=n)
            wrong = wrong + (wrong >= reference)
            proposes = rng.random(n) < self.config.proposal_rate if self.config.proposal_rate < 1.0 else None
            draws = self.draws[item.slot] = (np.where(right, reference, wrong).astype(np.int64), proposes)
        return draws


def make_synthetic(config: SyntheticConfig, ctx) -> SyntheticProposer:
    """Factory registered as ``synthetic``."""
    if getattr(ctx, "reference_output", None) is None:
        raise StageError(
            "the synthetic proposer needs the engine's reference output (ctx.reference_output), "
            "which this engine did not provide"
        )
    return SyntheticProposer(config, ctx.reference_output, ctx.target.vocab_size)
