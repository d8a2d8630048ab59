"""Draft-model proposer: a small causal LM of the target's tokenizer drafts k tokens per step.

The config declares the draft as an auxiliary model (``auxiliary_models``), so the engine
exports and compiles it with the same stages as the target, as stages of its own
(``export:draft`` ...), also under ``--compile-only``; ``ctx.build_session`` then opens it: one
prefill shape and decode shapes of seq_len 1 and 2. The draft keeps its own KV cache with one row per slot.

Bookkeeping per slot: ``fed[p]`` is the token whose KV sits at position p of the draft cache,
for p < ``n_fed``; the first ``n_confirmed`` of them are known to equal the request's context.
At each ``propose`` the context (``ProposeInput.tokens``) is compared with what was fed:

* the valid prefix is ``n_confirmed`` plus the tokens of the last drafts the target accepted;
  everything after it is stale and is overwritten by writing at the same positions (the mask
  hides positions above the query, so no rewind is needed — DESIGN §4);
* the tokens after the valid prefix are *caught up*: after a step the target appended 1 token
  (a correction, or the first token after prefill) or 2 (every draft accepted: the last draft,
  which the draft never consumed, and the bonus token). 1 or 2 tokens run through the decode
  shape of seq_len 1 or 2 — right-aligned, padding at position -1 — and more (a new request's
  prompt, or a request that skipped steps) run first through the prefill shape in chunks;
* then k tokens are drafted one at a time (seq_len 1), greedily, or sampled from the draft
  distribution after the workload's temperature/top-k/top-p when ``sampling: sample`` (the
  distributions are returned for rejection sampling).

Every run is batched across the slots that need it; rows of other slots are padding
(position -1, a valid pad token id, never -1 as a token id). A new request's prompt is
prefilled at its first ``propose`` rather than in ``add_request``, so requests that join
together (static batching) share one prefill run per chunk. Under continuous batching the
prefill shape has batch 1 and writes row ``slot`` through ``batch_index``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import (AuxiliaryModel, ModelInfo, PeerEquivalent, Proposal, ProposeInput, Proposer, Request,
                         Sampling)
from spdflow.errors import RecipeError, StageError

#: The draft's decode shapes: one token, and two for the bonus-token catch-up.
DRAFT_K_LIST = (0, 1)


class DraftModelConfig(BaseModel):
    """The ``with:`` block of ``proposer: {uses: draft_model}``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        description="The draft LM, written like the recipe's model.id "
        "(e.g. 'spdflow:tinycode-draft', a local HF directory, or a cached hub id)."
    )
    num_speculative_tokens: int | None = Field(
        None, ge=1, description="Draft at most this many tokens per step (default: the step's k_max)."
    )
    device_ids: list[int] | None = Field(
        None, min_length=1, description="QAIC device group of the draft (default: the target's)."
    )
    num_cores: int | None = Field(
        None, ge=1, le=64, description="AI cores per device for the draft (default: the target's)."
    )
    sampling: Literal["greedy", "sample"] = Field(
        "greedy",
        description="'greedy' drafts the argmax; 'sample' draws from the draft distribution "
        "(with the workload's temperature, top-k, top-p) and hands it to rejection sampling.",
    )

    def auxiliary_models(self) -> list[AuxiliaryModel]:
        """The draft, compiled by the engine like the target: one prefill shape and decode
        shapes of one token (K=0) and two (K=1, a bonus-token catch-up)."""
        return [AuxiliaryModel(
            role="draft", model_id=self.model, k_list=DRAFT_K_LIST,
            device_ids=tuple(self.device_ids) if self.device_ids else None, num_cores=self.num_cores,
        )]

    def peer_equivalent(self) -> PeerEquivalent:
        """HF's assisted generation with the same draft."""
        return PeerEquivalent(assistant_model=self.model)


# ------------------------------------------------------------------------------ compatibility


def tokenizers_match(a: Path, b: Path) -> bool:
    """True when two tokenizer.json files encode alike: same bytes, or same model and added
    tokens (formatting and normalizer metadata may differ between releases of one family)."""
    raw_a, raw_b = Path(a).read_bytes(), Path(b).read_bytes()
    if raw_a == raw_b:
        return True
    try:
        ja, jb = json.loads(raw_a), json.loads(raw_b)
    except ValueError:
        return False

    def added(j):
        return sorted((t.get("id"), t.get("content")) for t in j.get("added_tokens") or [])

    return ja.get("model") == jb.get("model") and added(ja) == added(jb)


def check_draft_compatible(draft_id: str, draft: ModelInfo, target: ModelInfo) -> None:
    """Raise RecipeError when the draft cannot propose tokens of the target's vocabulary."""
    hint = "use a draft of the target's model family (the same tokenizer)"
    if draft.vocab_size != target.vocab_size:
        raise RecipeError(
            f"draft model '{draft_id}' has vocab {draft.vocab_size} but target '{target.name}' "
            f"has {target.vocab_size}; {hint}",
            hint=hint,
        )
    a, b = draft.tokenizer_file, target.tokenizer_file
    if a is not None and b is not None and Path(a).is_file() and Path(b).is_file():
        if not tokenizers_match(a, b):
            raise RecipeError(
                f"draft model '{draft_id}' and target '{target.name}' have different tokenizers "
                f"({a} vs {b}); {hint}",
                hint=hint,
            )


# ------------------------------------------------------------------------------ shapes


@dataclass(frozen=True)
class DraftShapes:
    """What the proposer needs from the draft session's specializations."""

    prefill_batch: int
    prefill_len: int
    decode_batch: int
    decode_lens: frozenset[int]
    continuous_batching: bool

    @staticmethod
    def of(session) -> "DraftShapes":
        specs = list(session.specializations)
        prefill = [s for s in specs if s.kind == "prefill"]
        decode = [s for s in specs if s.kind == "decode" and s.seq_len == s.num_logits_to_keep]
        if not prefill or not any(s.seq_len == 1 for s in decode):
            raise StageError(
                "the draft session lacks a prefill shape or a decode shape of seq_len 1; "
                "it must be built with k_list=[0, 1]"
            )
        cb = any(s.full_batch_size is not None for s in specs) or (
            prefill[0].batch_size != session.kv_batch_size
        )
        return DraftShapes(
            prefill_batch=prefill[0].batch_size,
            prefill_len=prefill[0].seq_len,
            decode_batch=max(s.batch_size for s in decode),
            decode_lens=frozenset(s.seq_len for s in decode),
            continuous_batching=cb,
        )


# ------------------------------------------------------------------------------ proposer


@dataclass
class _Slot:
    fed: np.ndarray  # int64 [ctx_len]: the token at each written position of the draft cache
    n_fed: int
    n_confirmed: int
    rng: np.random.Generator


@dataclass
class _Row:
    """One request's work in one propose call."""

    slot: int
    tokens: np.ndarray
    k: int
    state: _Slot
    pending_from: int = 0  # first context position the draft has not consumed
    last_logits: np.ndarray | None = None


class DraftModelProposer(Proposer):
    """Drafts with a compiled draft LM; see the module docstring."""

    name = "draft_model"
    may_propose_nothing = False

    def __init__(self, config: DraftModelConfig, session, info: ModelInfo, sampling: Sampling):
        self.config = config
        self.session = session
        self.info = info
        self.shapes = DraftShapes.of(session)
        self.sampling = sampling
        self.sample = config.sampling == "sample" and sampling.temperature > 0
        self.pad_id = int(info.pad_token_id) if 0 <= info.pad_token_id < session.vocab_size else 0
        self.slots: dict[int, _Slot] = {}
        #: runs per shape, for reports and tests: {"prefill": n, "decode1": n, "decode2": n}
        self.run_counts: dict[str, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def add_request(self, slot: int, request: Request) -> None:
        if not 0 <= slot < self.session.kv_batch_size:
            raise StageError(f"slot {slot} is outside the draft's {self.session.kv_batch_size} KV rows")
        self.slots[slot] = _Slot(
            fed=np.zeros(self.session.ctx_len, dtype=np.int64),
            n_fed=0,
            n_confirmed=0,
            rng=np.random.default_rng([request.seed, request.index, 0xD2AF7]),
        )

    def remove_request(self, slot: int) -> None:
        self.slots.pop(slot, None)

    def close(self) -> None:
        self.session.close()

    # -- proposing ---------------------------------------------------------------------------

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        results = [Proposal.empty() for _ in inputs]
        rows: list[tuple[int, _Row]] = []
        for i, item in enumerate(inputs):
            row = self._plan_row(item)
            if row is not None:
                rows.append((i, row))
        if not rows:
            return results
        work = [row for _, row in rows]
        self._bulk_feed(work)
        self._catch_up(work)
        drafts = self._draft(work)
        for (i, _), proposal in zip(rows, drafts):
            results[i] = proposal
        return results

    def _plan_row(self, item: ProposeInput) -> _Row | None:
        """The row's draft length and the first context position the draft must consume."""
        tokens = np.asarray(item.tokens, dtype=np.int64)
        length = len(tokens)
        k = item.k_max if self.config.num_speculative_tokens is None else min(
            item.k_max, self.config.num_speculative_tokens
        )
        # Drafting k tokens writes positions up to length+k-2; keep them below the trash slot.
        k = min(k, self.session.ctx_len - length)
        if k <= 0 or length == 0:
            return None
        state = self.slots.get(item.slot)
        if state is None:  # no add_request: start from an empty cache row
            self.add_request(item.slot, Request(item.request_index, "", tokens[:0], 0, 0))
            state = self.slots[item.slot]
        valid = min(state.n_confirmed, length)
        upto = min(state.n_fed, length)
        same = state.fed[valid:upto] == tokens[valid:upto]
        valid += int(np.argmin(same)) if not same.all() else len(same)
        # The anchor is always fed again: its logits give the first draft.
        valid = min(valid, length - 1)
        return _Row(item.slot, tokens, k, state, pending_from=valid)

    def _record(self, row: _Row, start: int, tokens: np.ndarray) -> None:
        row.state.fed[start : start + len(tokens)] = tokens
        row.state.n_fed = start + len(tokens)

    def _bulk_feed(self, rows: list[_Row]) -> None:
        """Consume all but the anchor through the prefill shape, for rows more than 2 behind."""
        behind = [r for r in rows if len(r.tokens) - r.pending_from > 2]
        if not behind:
            return
        chunk = self.shapes.prefill_len
        if self.shapes.continuous_batching:
            groups = [behind[i : i + self.shapes.prefill_batch] for i in range(0, len(behind), self.shapes.prefill_batch)]
        else:
            groups = [behind]
        for group in groups:
            spans = {id(r): (r.pending_from, len(r.tokens) - 1) for r in group}
            longest = max(end - start for start, end in spans.values())
            for offset in range(0, longest, chunk):
                ids = np.full((self.shapes.prefill_batch, chunk), self.pad_id, dtype=np.int64)
                pos = np.full((self.shapes.prefill_batch, chunk), -1, dtype=np.int64)
                batch_index = None
                if self.shapes.continuous_batching:
                    # Padding rows repeat a real slot with every position -1: nothing is written.
                    batch_index = np.full((self.shapes.prefill_batch, 1), group[0].slot, dtype=np.int64)
                for j, r in enumerate(group):
                    line = j if self.shapes.continuous_batching else r.slot
                    start, end = spans[id(r)]
                    lo, hi = start + offset, min(start + offset + chunk, end)
                    if lo >= hi:
                        continue
                    ids[line, : hi - lo] = r.tokens[lo:hi]
                    pos[line, : hi - lo] = np.arange(lo, hi)
                    if batch_index is not None:
                        batch_index[line, 0] = r.slot
                self._run("prefill", ids, pos, 1, batch_index)
            for r in group:
                start, end = spans[id(r)]
                self._record(r, start, r.tokens[start:end])
                r.pending_from = end

    def _catch_up(self, rows: list[_Row]) -> None:
        """Feed each row's remaining 1-2 context tokens; keep the logits after the anchor."""
        waiting = list(rows)
        while waiting:
            most = max(len(r.tokens) - r.pending_from for r in waiting)
            width = 2 if most >= 2 and 2 in self.shapes.decode_lens else 1
            feeds = {}
            for r in waiting:
                n = min(width, len(r.tokens) - r.pending_from)
                feeds[r.slot] = (r.tokens[r.pending_from : r.pending_from + n], r.pending_from)
            logits = self._decode(width, feeds)
            still = []
            for r in waiting:
                toks, start = feeds[r.slot]
                self._record(r, start, toks)
                r.pending_from = start + len(toks)
                if r.pending_from == len(r.tokens):
                    r.last_logits = np.array(logits[r.slot, -1], dtype=np.float32)
                    r.state.n_confirmed = len(r.tokens)
                else:
                    still.append(r)
            waiting = still

    def _draft(self, rows: list[_Row]) -> list[Proposal]:
        """k tokens per row, one decode run per token after the first."""
        drafted: list[list[int]] = [[] for _ in rows]
        probs: list[list[np.ndarray]] = [[] for _ in rows]
        logits_of = {r.slot: r.last_logits for r in rows}
        for step in range(max(r.k for r in rows)):
            if step > 0:
                feeds = {
                    r.slot: (np.asarray(drafted[i][-1:], dtype=np.int64), len(r.tokens) + step - 1)
                    for i, r in enumerate(rows)
                    if r.k > step
                }
                logits = self._decode(1, feeds)
                for slot in feeds:
                    logits_of[slot] = logits[slot, -1]
            for i, r in enumerate(rows):
                if r.k <= step:
                    continue
                token, p = self._choose(logits_of[r.slot], r.state.rng)
                drafted[i].append(token)
                if p is not None:
                    probs[i].append(p)
        out = []
        for i, r in enumerate(rows):
            tokens = np.asarray(drafted[i], dtype=np.int64)
            # The draft consumed every draft but the last; the next call checks which survived.
            self._record(r, len(r.tokens), tokens[:-1])
            out.append(Proposal(tokens, np.stack(probs[i]).astype(np.float32) if probs[i] else None))
        return out

    def _choose(self, logits: np.ndarray, rng: np.random.Generator) -> tuple[int, np.ndarray | None]:
        if not self.sample:
            return int(np.argmax(logits)), None
        from spdflow_decoding.acceptance import sample_from, target_distribution

        p = target_distribution(logits, self.sampling)
        return sample_from(p, rng), p

    # -- session runs --------------------------------------------------------------------------

    def _decode(self, width: int, feeds: dict[int, tuple[np.ndarray, int]]) -> np.ndarray:
        """One decode run of seq_len ``width``: each slot's tokens right-aligned (the logits rows
        end at the last valid position), the rest padding."""
        batch = self.shapes.decode_batch
        ids = np.full((batch, width), self.pad_id, dtype=np.int64)
        pos = np.full((batch, width), -1, dtype=np.int64)
        for slot, (toks, start) in feeds.items():
            n = len(toks)
            ids[slot, width - n :] = toks
            pos[slot, width - n :] = np.arange(start, start + n)
        batch_index = np.arange(batch, dtype=np.int64)[:, None] if self.shapes.continuous_batching else None
        return self._run(f"decode{width}", ids, pos, width, batch_index)

    def _run(self, label, ids, pos, nlk, batch_index) -> np.ndarray:
        self.run_counts[label] = self.run_counts.get(label, 0) + 1
        return self.session.run(ids, pos, nlk, batch_index)


def make_draft_model(config: DraftModelConfig, ctx) -> DraftModelProposer:
    """Factory registered as ``draft_model``: builds the draft session and checks the vocab."""
    if getattr(ctx, "build_session", None) is None:
        raise StageError("the draft_model proposer needs ctx.build_session, which this engine did not provide")
    [draft] = config.auxiliary_models()
    session, info = ctx.build_session(
        model_id=draft.model_id,
        k_list=list(draft.k_list),
        role=draft.role,
        device_ids=config.device_ids,
        num_cores=draft.num_cores,
    )
    try:
        check_draft_compatible(config.model, info, ctx.target)
        return DraftModelProposer(config, session, info, ctx.sampling)
    except Exception:
        session.close()
        raise
