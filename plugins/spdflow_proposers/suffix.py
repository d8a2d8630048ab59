"""Suffix decoding (ArcticInference, arXiv 2411.04975), model-free.

Design
------
Each request owns a *depth-bounded suffix trie* over its token sequence (prompt + output): the
trie of every substring of length <= ``max_depth``, each node counting how often its substring
occurs. It is built incrementally: the request keeps its *active nodes*, the trie nodes of the
sequence's current suffixes of length 0..max_depth-1; appending a token moves each to (or
creates) its child and bumps the child's count — O(max_depth) dictionary operations per token,
no rebuild. The active nodes double as the match of the context against the request's own trie,
so matching costs nothing at propose time.

An optional global trie holds the outputs of the last ``max_cached_requests`` finished requests
(FIFO; an evicted output's substrings are decremented and empty nodes pruned). Each request
matches the global trie with its own active-node set, advanced on every accepted token and
recomputed from the last max_depth tokens when the global trie changed.

Proposing, per request: for every match length m (1..max_depth-1) that has a node in a trie, walk
from that node greedily to the most frequent child, with the path probability
prod(count(child) / count(parent)); stop at ``min_token_prob``, at a node without children, or
after min(k_max, ceil(max_spec_factor * m + max_spec_offset)) tokens — longer matches earn
longer proposals. The draft with the largest score (the sum of the path probabilities, the
expected number of accepted tokens under the frequency model) wins; ties go to the longer match,
then to the request's own trie. Like ArcticInference, match length + proposal length is bounded
by max_depth.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import Proposal, ProposeInput, Proposer, Request


class SuffixConfig(BaseModel):
    """The ``with:`` block of ``proposer: {uses: suffix}`` (ArcticInference's suffix_* names)."""

    model_config = ConfigDict(extra="forbid")

    max_depth: int = Field(
        32, ge=2, le=1024,
        description="Longest substring the tries hold: bounds match length + proposal length.",
    )
    max_spec_factor: float = Field(
        1.0, ge=0.0, description="Proposal length cap = ceil(max_spec_factor * match length + offset)."
    )
    max_spec_offset: float = Field(
        0.0, description="Added to max_spec_factor * match length before rounding up."
    )
    min_token_prob: float = Field(
        0.1, ge=0.0, le=1.0,
        description="Stop the proposal when the estimated probability of the path drops below this.",
    )
    max_cached_requests: int = Field(
        8, ge=0,
        description="Outputs of this many finished requests are kept in a global trie shared by "
        "later requests (FIFO); 0 disables the cross-request cache.",
    )


# A trie node is a list [count, children, depth] rather than an object: building the trie is
# the proposer's main cost (max_depth nodes per token) and a list is ~5x cheaper to create.
_COUNT, _CHILDREN, _DEPTH = 0, 1, 2
_Node = list


def _new_node(depth: int) -> _Node:
    return [0, {}, depth]


class SuffixTrie:
    """A depth-bounded trie of substrings with occurrence counts (see the module docstring)."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _new_node(0)

    def extend(self, active: list[_Node], token: int) -> list[_Node]:
        """Append ``token`` after the suffixes ``active`` (their nodes, shortest first); returns
        the new active nodes, keeping only those that can still grow (depth < max_depth)."""
        max_depth = self.max_depth
        new_active = []
        for node in (self.root, *active):
            children = node[_CHILDREN]
            child = children.get(token)
            if child is None:
                child = children[token] = [1, {}, node[_DEPTH] + 1]
            else:
                child[_COUNT] += 1
            if child[_DEPTH] < max_depth:
                new_active.append(child)
        return new_active

    def insert(self, tokens: Sequence[int]) -> None:
        """Count every substring (up to max_depth) of ``tokens``."""
        active: list[_Node] = []
        for token in tokens:
            active = self.extend(active, int(token))

    def remove(self, tokens: Sequence[int]) -> None:
        """Undo :meth:`insert` of the same ``tokens``; nodes whose count drops to 0 are pruned."""
        tokens = [int(t) for t in tokens]
        for start in range(len(tokens)):
            node = self.root
            for token in tokens[start : start + self.max_depth]:
                child = node[_CHILDREN][token]
                child[_COUNT] -= 1
                if child[_COUNT] == 0:
                    # Counts never grow with depth, so the whole subtree was this occurrence's.
                    del node[_CHILDREN][token]
                    break
                node = child

    def follow(self, active: list[_Node], token: int) -> list[_Node]:
        """Like :meth:`extend` but read-only: the suffixes that still occur in the trie."""
        new_active = []
        for node in (self.root, *active):
            child = node[_CHILDREN].get(token)
            if child is not None and child[_DEPTH] < self.max_depth:
                new_active.append(child)
        return new_active

    def match(self, tokens: Sequence[int]) -> list[_Node]:
        """The active nodes of the context ``tokens`` (only its last max_depth-1 tokens matter)."""
        active: list[_Node] = []
        for token in tokens[-(self.max_depth - 1):]:
            active = self.follow(active, int(token))
        return active


@dataclass
class _Draft:
    tokens: list[int]
    score: float
    match_len: int
    source: str  # "request" or "global"


def speculate(node: _Node, max_tokens: int, min_token_prob: float) -> tuple[list[int], float]:
    """Greedy most-frequent path from ``node``: its tokens and its score (sum of path probs)."""
    tokens: list[int] = []
    score, prob = 0.0, 1.0
    while len(tokens) < max_tokens and node[_CHILDREN]:
        # Highest count; the smaller token id on ties, so proposals are deterministic.
        token, child = max(node[_CHILDREN].items(), key=lambda item: (item[1][_COUNT], -item[0]))
        prob *= child[_COUNT] / node[_COUNT]
        if prob < min_token_prob:
            break
        tokens.append(token)
        score += prob
        node = child
    return tokens, score


@dataclass
class _SlotState:
    trie: SuffixTrie
    active: list[_Node] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    num_prompt: int = 0
    global_active: list[_Node] = field(default_factory=list)
    global_version: int = -1


class SuffixProposer(Proposer):
    """Suffix decoding over per-request tries and a bounded global trie of past outputs."""

    name = "suffix"
    may_propose_nothing = True

    def __init__(self, config: SuffixConfig):
        self.config = config
        self.slots: dict[int, _SlotState] = {}
        self.global_trie = SuffixTrie(config.max_depth)
        self.global_version = 0
        self.cached_outputs: deque[list[int]] = deque()

    # -- lifecycle ---------------------------------------------------------------------------

    def add_request(self, slot: int, request: Request) -> None:
        state = _SlotState(trie=SuffixTrie(self.config.max_depth))
        state.num_prompt = len(request.prompt_ids)
        self.slots[slot] = state
        self._append(state, request.prompt_ids)

    def on_accepted(self, slot: int, tokens: np.ndarray) -> None:
        state = self.slots.get(slot)
        if state is not None:
            self._append(state, tokens)

    def remove_request(self, slot: int) -> None:
        state = self.slots.pop(slot, None)
        if state is None or self.config.max_cached_requests <= 0:
            return
        output = state.tokens[state.num_prompt :]
        if not output:
            return
        self.global_trie.insert(output)
        self.cached_outputs.append(output)
        while len(self.cached_outputs) > self.config.max_cached_requests:
            self.global_trie.remove(self.cached_outputs.popleft())
        self.global_version += 1

    def _append(self, state: _SlotState, tokens) -> None:
        for token in (int(t) for t in tokens):
            state.tokens.append(token)
            state.active = state.trie.extend(state.active, token)
            if state.global_version == self.global_version:
                state.global_active = self.global_trie.follow(state.global_active, token)

    # -- proposing ---------------------------------------------------------------------------

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        return [self._propose_one(item) for item in inputs]

    def _propose_one(self, item: ProposeInput) -> Proposal:
        state = self.slots.get(item.slot)
        if item.k_max <= 0:
            return Proposal.empty()
        if state is None or len(state.tokens) != len(item.tokens):
            # The engine's context and ours disagree (no add_request, missed on_accepted):
            # rebuild from the context rather than propose from a wrong state.
            state = self._rebuild(item)
        best = self._best_draft("request", state.active, item.k_max, None)
        if self.cached_outputs:
            if state.global_version != self.global_version:
                state.global_active = self.global_trie.match(state.tokens)
                state.global_version = self.global_version
            best = self._best_draft("global", state.global_active, item.k_max, best)
        if best is None or not best.tokens:
            return Proposal.empty()
        return Proposal(np.asarray(best.tokens, dtype=np.int64))

    def _rebuild(self, item: ProposeInput) -> _SlotState:
        request = Request(item.request_index, "", np.asarray(item.tokens[: item.num_prompt_tokens]), 0, 0)
        self.add_request(item.slot, request)
        state = self.slots[item.slot]
        self._append(state, item.tokens[item.num_prompt_tokens :])
        return state

    def _best_draft(self, source: str, active: list[_Node], k_max: int, best: _Draft | None) -> _Draft | None:
        """The best draft over every match length in one trie, compared with ``best`` so far."""
        cfg = self.config
        for node in active:  # ascending match length
            if not node[_CHILDREN]:
                continue
            limit = math.ceil(cfg.max_spec_factor * node[_DEPTH] + cfg.max_spec_offset - 1e-9)
            limit = min(k_max, limit)
            if limit <= 0:
                continue
            tokens, score = speculate(node, limit, cfg.min_token_prob)
            if not tokens:
                continue
            # Within a trie, lengths ascend, so ">=" gives ties to the longer match; the
            # request's own trie is searched first and the global trie must beat it strictly.
            if best is None or score > best.score or (score == best.score and best.source == source):
                best = _Draft(tokens, score, node[_DEPTH], source)
        return best
