"""Prompt lookup decoding (n-gram matching over the request's own context).

The last n tokens of the context (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``)
are searched among earlier positions; the tokens that followed an earlier occurrence are the
proposal. Among *all* matches of all n, the one with the longest continuation (capped at k_max)
wins, as in QEfficient PR #984: a short n-gram followed by k_max tokens beats a long one near the
end of the context. Ties go to the larger n, then to the most recent occurrence: recent text
(the code being edited, the turn being answered) predicts the next tokens better than old text,
and a larger n is a more specific match.

Only the self-match (the suffix itself, which has no continuation) is excluded. Occurrences
that overlap the suffix are kept: their continuation is made of tokens that really followed
them, which is what periodic text (``a b a b a``) repeats.

Each proposal is graded (``Proposal.grade``) by the length of the n-gram it matched, which a K
policy may read: a longer match is more specific, and its proposals hold longer.

Search, vectorised with numpy and stateless: candidate end positions are the earlier
occurrences of the last token; each candidate's match length is grown one token at a time
(``max`` comparisons over a shrinking candidate set), so a call is O(L) numpy work plus
O(max * candidates). Scores are compared as one integer key per candidate.
"""
from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from spdflow.api import PeerEquivalent, Proposal, ProposeInput, Proposer


class PromptLookupConfig(BaseModel):
    """The ``with:`` block of ``proposer: {uses: prompt_lookup}``."""

    model_config = ConfigDict(extra="forbid")

    prompt_lookup_min: int = Field(1, ge=1, description="Shortest n-gram to match (vLLM's name).")
    prompt_lookup_max: int = Field(3, ge=1, description="Longest n-gram to match (vLLM's name).")
    lookup_in: Literal["all", "prompt"] = Field(
        "all",
        description="Where to look for earlier occurrences: 'all' (prompt and generated tokens) "
        "or 'prompt' (the prompt only, as HF prompt lookup).",
    )

    @model_validator(mode="after")
    def _min_le_max(self):
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) is larger than "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        return self

    def peer_equivalent(self) -> PeerEquivalent:
        """HF's and llama.cpp's prompt lookup, matching up to ``prompt_lookup_max`` tokens."""
        return PeerEquivalent(lookup_ngram=self.prompt_lookup_max)


def find_continuation(
    tokens: np.ndarray, k_max: int, n_min: int, n_max: int, search_end: int | None = None
) -> np.ndarray:
    """The best n-gram continuation of ``tokens`` (see the module docstring), at most k_max long.

    ``search_end`` limits earlier occurrences *and* their continuations to ``tokens[:search_end]``
    (the prompt, for ``lookup_in: prompt``); by default the whole context except its last token.
    Returns an empty int64 array when nothing matches.
    """
    return find_matched_continuation(tokens, k_max, n_min, n_max, search_end)[0]


def find_matched_continuation(
    tokens: np.ndarray, k_max: int, n_min: int, n_max: int, search_end: int | None = None
) -> tuple[np.ndarray, int]:
    """:func:`find_continuation` and the length of the n-gram it matched (0 when none)."""
    length = len(tokens)
    limit = length if search_end is None else min(search_end, length)
    nothing = np.zeros(0, dtype=np.int64), 0
    if k_max <= 0 or length < n_min + 1 or limit < 2:
        return nothing
    # Candidate ends e: tokens[e] == last token, with at least one continuation token before
    # ``limit`` (which also excludes the self-match e = length-1).
    ends = np.flatnonzero(tokens[: limit - 1] == tokens[-1])
    matched = np.ones(len(ends), dtype=np.int64)
    alive = ends
    for j in range(1, n_max):
        if len(alive) == 0 or j >= length:
            break
        ok = alive >= j
        ok[ok] = tokens[alive[ok] - j] == tokens[length - 1 - j]
        alive = alive[ok]
        matched[np.searchsorted(ends, alive)] += 1
    good = matched >= n_min
    if not good.any():
        return nothing
    ends, matched = ends[good], np.minimum(matched[good], n_max)
    continuation = np.minimum(limit - 1 - ends, k_max)
    # Lexicographic (continuation, n, recency) as one integer key.
    key = (continuation * (n_max + 1) + matched) * length + ends
    best = int(np.argmax(key))
    start = int(ends[best]) + 1
    return tokens[start : start + int(continuation[best])].astype(np.int64, copy=True), int(matched[best])


class PromptLookupProposer(Proposer):
    """Stateless n-gram proposer; see the module docstring."""

    name = "prompt_lookup"
    may_propose_nothing = True

    def __init__(self, config: PromptLookupConfig):
        self.config = config

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        out = []
        for item in inputs:
            tokens = np.asarray(item.tokens)
            end = item.num_prompt_tokens if self.config.lookup_in == "prompt" else None
            found, n = find_matched_continuation(
                tokens, item.k_max, self.config.prompt_lookup_min, self.config.prompt_lookup_max, end
            )
            # graded by the matched n-gram's length: on the code workload at fixed K = 7, a
            # proposal from a 1-token match held 1.35 tokens on average, from a 3-token match 4.91
            out.append(Proposal(found, grade=n if len(found) else None))
        return out


def make_prompt_lookup(config: PromptLookupConfig, ctx) -> PromptLookupProposer:
    """Factory registered as ``prompt_lookup``."""
    return PromptLookupProposer(config)
