"""The generation loop: chunked prefill, then propose -> choose K -> verify -> accept.

Semantics (DESIGN §4, with upstream bugs fixed):

* A request owns one KV row ("slot"). Its tokens sit at positions 0..n-1; the last one, the
  anchor, has no KV yet. A step feeds the anchor plus K proposals at positions
  ``anchor_pos + 0..K`` — rebuilt every step — and -1 on unused slots, whose ids are the pad
  token (never -1).
* The last KV slot (ctx_len - 1) is never used for a real token: position -1 writes land there.
  So a request stops with reason ``ctx_len`` once it holds ctx_len tokens.
* Per step a request may use at most ``k_max = min(max K, tokens left - 1, room left)``
  proposals, so speculation can never overshoot ``max_new_tokens`` or ctx_len and stops
  exactly where one-token decoding would. EOS inside accepted tokens ends the request there.
* Without continuous batching requests run in groups of ``batch_size``; with
  ``full_batch_size`` they join free slots as others leave (batch-1 prefill into
  ``batch_index``).
"""
from __future__ import annotations

import time
import weakref
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from spdflow.api import (AcceptRow, KPolicy, PolicyServices, Proposal, Proposer, ProposeInput, Request, Sampling,
                         StepContext, StepOutcome, TargetOutputs)
from spdflow.costs import time_round
from spdflow.errors import PluginError, SpdflowError, StageError


def prompt_problem(index: int, n_tokens: int, ctx_len: int) -> tuple[str, str] | None:
    """(message, hint) when prompt ``index`` of ``n_tokens`` tokens cannot run with ``ctx_len``.

    The one rule shared by generation and preflight (``spdflow lint``, ``--dry-run``)."""
    limit = ctx_len - 1
    if n_tokens == 0:
        return f"prompt {index} is empty", "remove empty prompts from the workload"
    if n_tokens > limit:
        return (f"prompt {index} has {n_tokens} tokens but ctx_len {ctx_len} leaves room for {limit}",
                "raise specialization.ctx_len or shorten the prompt")
    return None


def check_prompts(requests: Sequence[Request], ctx_len: int) -> None:
    """Every prompt must be non-empty and leave room in the KV cache (checked before any work)."""
    for r in requests:
        problem = prompt_problem(r.index, len(r.prompt_ids), ctx_len)
        if problem is not None:
            raise StageError(problem[0], hint=problem[1])


def read_only_copy(array: np.ndarray) -> np.ndarray:
    """A read-only copy for plugins: writing into what the engine hands out changes nothing."""
    copy = np.array(array, dtype=np.int64)
    copy.setflags(write=False)
    return copy


_NO_PROPOSAL = Proposal.empty()  # shared: the engine never changes a proposal in place


class StepCosts:
    """Measured verify seconds per compiled K, kept per session and shape set by whoever owns
    this object: a run (the engine), a bench, or one generator. Nothing is shared through module
    state, so two runs in one process never see each other's figures."""

    def __init__(self):
        #: {session: {(rows, ks): {k: seconds}}}; a closed, collected session drops its entry
        self._by_session: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def get(self, pm, session, rows: int, ks: Sequence[int], pad_token_id: int,
            batch_index: np.ndarray | None = None, clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
        """The figures for this session and shape set, measured on the first ask."""
        key = (rows, tuple(ks))
        try:
            cached = self._by_session.setdefault(session, {})
        except TypeError:  # a session type without weak references: measure every time
            cached = {}
        if key not in cached:
            cached[key] = measure_step_costs(pm, session, rows, ks, pad_token_id, batch_index, clock=clock)
        return dict(cached[key])


def measure_step_costs(pm, session, rows: int, ks: Sequence[int], pad_token_id: int,
                       batch_index: np.ndarray | None = None, rounds: int = 4, repeats: int = 3, warmup: int = 4,
                       clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Median seconds of one verify run per compiled K (measured now; :class:`StepCosts` keeps them).

    Every position is -1, so the runs write only the reserved last KV slot and can happen at
    any time without touching a request's cache. Each of ``rounds`` rounds runs every K as a
    short block (``warmup`` untimed runs, then ``repeats`` timed ones), the order of K rotating
    per round: this is the steady cost of repeating K, without the cost of switching shapes
    (a policy learns that from the steps themselves), and a burst of load on a shared machine
    lands on every K alike instead of on one K's block. Timed in one block per K, a 2-core
    machine at load 2.8 once gave batch 2 K=4 6.8 ms against K=7 3.6 ms (quiet: 1.5 and 1.9);
    a policy that believes such a start never runs the larger K to learn better.

    The warm-up is 4 runs because the runs after a change of shape stay slow for several steps.
    With 1 warm-up run and 2 timed, the grid put K = 0 at batch 1, 2 and 4 12-32 % above what
    no-spec generations measured, and each larger K's ratio to K = 0 8-20 % below theirs, so a
    policy starting from it speculates where K = 0 is better; with 4 and 3, K = 0 and the ratios
    came within 10 % at batch 1-8 (benchmarks/step_cost_grid.py; benchmarks/k_policy_rounds.md, "Issue
    23, round 11").
    """
    times: dict[int, list[float]] = {k: [] for k in ks}
    for round_ in range(rounds):
        for k, timed in time_round(pm, session, rows, ks, pad_token_id, batch_index, round_, warmup, repeats,
                                   clock=clock).items():
            times[k] += timed
    return {k: float(np.median(v)) for k, v in times.items()}


class _LoopServices(PolicyServices):
    """The services a :class:`Generator` offers its K policy."""

    def __init__(self, generator: "Generator"):
        self._generator = generator
        self._costs: dict[int, float] | None = None

    def step_costs(self) -> dict[int, float]:
        if self._costs is None:
            self._costs = self._generator.measured_step_costs()
        return dict(self._costs)

    def score_proposals(self) -> None:
        self._generator._scoring = True


def split_logits(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(verify logits [b, n, vocab], head logits [b, n, heads, vocab] or None).

    A multi-projection target returns [b, n, heads+1, vocab]; row 0 is its own LM head, the
    only row verification and acceptance ever read.
    """
    if logits.ndim == 4:
        return logits[:, :, 0], logits[:, :, 1:]
    return logits, None


@dataclass
class RequestResult:
    index: int
    tokens: np.ndarray  # generated tokens only
    stop_reason: str
    prompt_tokens: int
    ttft_s: float
    finish_s: float


@dataclass
class _Live:
    """A request in a slot."""

    request: Request
    slot: int
    buffer: np.ndarray  # int64 [ctx_len]: prompt + generated
    length: int
    generated: int = 0
    ttft_s: float = 0.0
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    #: proposals still being scored against the tokens that follow: [start, tokens, matched, grade]
    shadows: list = field(default_factory=list)

    @property
    def tokens(self) -> np.ndarray:
        return self.buffer[: self.length]


@dataclass
class LoopConfig:
    prefill_seq_len: int
    ctx_len: int
    batch_size: int
    full_batch_size: int | None
    k_list: list[int]
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    vocab_size: int
    sampling: Sampling
    ignore_eos: bool = False


class Generator:
    """Runs a workload through one target session with one proposer, policy and acceptor."""

    def __init__(self, pm, session, config: LoopConfig, *, proposer=None, proposer_name: str = "",
                 proposer_plugin: str = "", policy=None, acceptor=None, trace: Callable[[dict], None] | None = None,
                 on_tokens: Callable[[int], None] | None = None, clock: Callable[[], float] = time.perf_counter,
                 step_costs: StepCosts | None = None):
        self.pm = pm
        #: the time source of every figure the loop records; a what-if replay passes a clock on
        #: which verify runs take their priced time (spdflow.whatif)
        self.clock = clock
        self.session = session
        self.cfg = config
        self.proposer = proposer
        self.proposer_name = proposer_name
        #: tell the proposer what was accepted only if it listens (the base method does nothing)
        self._tell_accepted = proposer is not None and getattr(type(proposer), "on_accepted", None) is not Proposer.on_accepted
        #: hand the K policy the proposals' grades only if it reads them
        reads = getattr(type(policy), "see_grades", None) if policy is not None else None
        self._tell_grades = reads is not None and reads is not KPolicy.see_grades
        #: who to blame in errors, e.g. "plugin 'spdflow_proposers' 0.1.0"
        self.proposer_plugin = proposer_plugin
        self.policy = policy
        #: the K policy only runs (start/budget/choose/observe) when there is a proposer
        self._policy_runs = proposer is not None and policy is not None
        #: score every proposal against the tokens the target goes on to emit (StepOutcome.scored);
        #: on once the policy asks (PolicyServices.score_proposals)
        self._scoring = False
        #: measured step costs, owned by the run that passed them (else by this generator)
        self.step_costs = step_costs if step_costs is not None else StepCosts()
        #: extra target outputs the proposer reads (head logits, hidden states)
        self._wants = tuple(getattr(proposer, "target_outputs", ()) or ()) if proposer is not None else ()
        self.acceptor = acceptor
        self.trace = trace or (lambda record: None)
        self.on_tokens = on_tokens or (lambda n: None)
        self.ks = sorted(set(config.k_list))
        self.max_k = self.ks[-1] if proposer is not None else 0
        self.eos = frozenset(() if config.ignore_eos else (int(t) for t in config.eos_token_ids))
        self.rows = config.full_batch_size or config.batch_size
        self.cb = config.full_batch_size is not None
        self._ids = {k: np.full((self.rows, k + 1), config.pad_token_id, dtype=np.int64) for k in self.ks}
        self._pos = {k: np.full((self.rows, k + 1), -1, dtype=np.int64) for k in self.ks}
        self._arange = np.arange(max(self.ks) + 1, dtype=np.int64)
        self._batch_index = np.arange(self.rows, dtype=np.int64).reshape(-1, 1) if self.cb else None
        self.step_count = 0
        self.t0 = 0.0

    # ------------------------------------------------------------------------- public

    def generate(self, requests: Sequence[Request]) -> list[RequestResult]:
        """Generate for every request; results in request order."""
        check_prompts(requests, self.cfg.ctx_len)
        self._start_policy()
        self.t0 = self.clock()
        results: dict[int, RequestResult] = {}
        pending = deque(requests)
        slots: list[_Live | None] = [None] * self.rows
        try:
            while pending or any(slots):
                self._admit(pending, slots, results)
                if not any(slots):
                    continue
                # a request waits for a free slot only under CB: a static batch admits the next
                # group once every row is done, so until then it ends with its last row
                self._step(slots, results, len(pending) if self.cb else 0)
        finally:
            for live in slots:
                if live is not None and self.proposer is not None:
                    self._call_proposer("remove_request", live.slot)
        return [results[r.index] for r in requests]

    def _start_policy(self) -> None:
        """Hand the K policy the compiled K-list, the rows and the services it may ask for."""
        if not self._policy_runs:
            return
        self._call_policy("start", list(self.ks), self.rows, _LoopServices(self))

    def measured_step_costs(self) -> dict[int, float]:
        """The session's step costs for this loop's shapes (traced once per generation)."""
        started = self.clock()
        costs = self.step_costs.get(self.pm, self.session, self.rows, self.ks, self.cfg.pad_token_id,
                                    self._batch_index, clock=self.clock)
        self.trace({"kind": "step_costs", "duration_s": self.clock() - started,
                    "verify_s": {str(k): v for k, v in costs.items()}})
        return costs

    # ------------------------------------------------------------------------- prefill

    def _admit(self, pending: deque, slots: list, results: dict) -> None:
        """Fill free slots: any free slot under CB, a whole new group otherwise."""
        if self.cb:
            free = [s for s, live in enumerate(slots) if live is None]
            group = [(s, pending.popleft()) for s in free if pending]
            for slot, request in group:
                self._prefill([(slot, request)], slots, results)
        elif not any(slots) and pending:
            group = [(s, pending.popleft()) for s in range(self.rows) if pending]
            self._prefill(group, slots, results)

    def _prefill(self, group: list[tuple[int, Request]], slots: list, results: dict) -> None:
        cfg = self.cfg
        P = cfg.prefill_seq_len
        batch = 1 if self.cb else self.rows
        lives = []
        for slot, request in group:
            n = len(request.prompt_ids)
            buffer = np.full(cfg.ctx_len, cfg.pad_token_id, dtype=np.int64)
            buffer[:n] = request.prompt_ids
            rng = np.random.default_rng([request.seed, request.index])
            lives.append(_Live(request, slot, buffer, n, rng=rng))
        started = self.clock()
        chunks = -(-max(l.length for l in lives) // P)
        last_logits: dict[int, np.ndarray] = {}
        last_heads: dict[int, np.ndarray] = {}
        hidden_rows: dict[int, list[np.ndarray]] = {row: [] for row in range(len(lives))}
        ids = np.full((batch, P), cfg.pad_token_id, dtype=np.int64)
        pos = np.full((batch, P), -1, dtype=np.int64)
        for c in range(chunks):
            ids.fill(cfg.pad_token_id)
            pos.fill(-1)
            ends = {}
            for row, live in enumerate(lives):
                r = 0 if self.cb else live.slot
                lo, hi = c * P, min((c + 1) * P, live.length)
                if lo < hi:
                    ids[r, : hi - lo] = live.buffer[lo:hi]
                    pos[r, : hi - lo] = np.arange(lo, hi)
                    if hi == live.length:
                        ends[row] = r
            batch_index = np.array([[lives[0].slot]], dtype=np.int64) if self.cb else None
            logits = self.pm.hook.spdflow_verify(session=self.session, input_ids=ids, position_ids=pos,
                                                 num_logits_to_keep=1, batch_index=batch_index)
            logits, heads = split_logits(logits)
            for row, r in ends.items():
                last_logits[row] = np.array(logits[r, 0])
                if heads is not None:
                    last_heads[row] = np.array(heads[r, :1])
            if "hidden_states" in self._wants:
                hidden = self._hidden_states()
                for row, live in enumerate(lives):
                    r = 0 if self.cb else live.slot
                    lo, hi = c * P, min((c + 1) * P, live.length)
                    if lo < hi:
                        hidden_rows[row].append(np.array(hidden[r, : hi - lo]))
        accepted = self._accept_first(lives, last_logits)
        now = self.clock() - self.t0
        for row, live in enumerate(lives):
            live.ttft_s = now
            slots[live.slot] = live
            if self.proposer is not None:
                self._call_proposer("add_request", live.slot,
                                    replace(live.request, prompt_ids=read_only_copy(live.request.prompt_ids)))
            if self._wants:
                self._call_proposer("on_target_outputs", live.slot, TargetOutputs(
                    np.arange(live.length, dtype=np.int64) if hidden_rows[row] else np.array([live.length - 1]),
                    last_heads.get(row), np.concatenate(hidden_rows[row]) if hidden_rows[row] else None))
            self.trace({"kind": "prefill", "t": now, "request": live.request.index, "slot": live.slot,
                        "chunks": chunks, "duration_s": self.clock() - started})
            self._append(live, accepted[row], slots, results)

    def _accept_first(self, lives, last_logits) -> list[np.ndarray]:
        """The first token of each request, from its last prefill logits (greedy or sampled)."""
        logits = np.stack([last_logits[row] for row in range(len(lives))])[:, None, :]
        rows = [AcceptRow(live.slot, Proposal.empty(), live.rng) for live in lives]
        return self._accept(logits, rows)

    # ------------------------------------------------------------------------- decode

    def _step(self, slots: list, results: dict, waiting: int = 0) -> None:
        cfg = self.cfg
        step_start = self.clock()
        active = [live for live in slots if live is not None]
        positions = [live.length - 1 for live in active]  # each row's anchor position
        budget = self._budget(active, waiting)
        if budget:
            proposals, propose_s = self._propose(active, {live.slot: min(budget, self._k_max(live)) for live in active})
        else:  # no proposer, or the K policy skips it this step
            proposals, propose_s = [_NO_PROPOSAL] * len(active), 0.0
        counts = [len(p.tokens) for p in proposals]
        k = self._choose_k(counts, proposals)
        if self._scoring:
            for live, proposal in zip(active, proposals):
                if len(proposal.tokens):
                    live.shadows.append([live.length, proposal.tokens.tolist(), 0, proposal.grade])
        ids, pos = self._ids[k], self._pos[k]
        ids.fill(cfg.pad_token_id)
        pos.fill(-1)
        rows = []
        for live, proposal in zip(active, proposals):
            tokens = proposal.tokens[:k]
            if len(tokens) < len(proposal.tokens):
                proposal = Proposal(tokens, None if proposal.probs is None else proposal.probs[:k], proposal.grade)
            n = len(tokens)
            anchor_pos = live.length - 1
            ids[live.slot, 0] = live.buffer[anchor_pos]
            ids[live.slot, 1 : n + 1] = tokens
            pos[live.slot, : n + 1] = self._arange[: n + 1] + anchor_pos
            rows.append(AcceptRow(live.slot, proposal, live.rng))
        verify_start = self.clock()
        logits = self.pm.hook.spdflow_verify(session=self.session, input_ids=ids, position_ids=pos,
                                             num_logits_to_keep=k + 1, batch_index=self._batch_index)
        verify_s = self.clock() - verify_start
        logits, heads = split_logits(logits)
        if len(active) == self.rows and all(live.slot == i for i, live in enumerate(active)):
            row_logits = logits
        else:
            row_logits = logits[[live.slot for live in active]]
        accepted = self._accept(row_logits, rows)
        proposed = tuple(len(row.proposal.tokens) for row in rows)
        n_accepted = tuple(len(tokens) - 1 for tokens in accepted)
        trace_rows = []
        scored: list[tuple[int, int]] = []
        scored_by: list[int] = []
        grades: list[int | None] = []
        hidden = self._hidden_states() if "hidden_states" in self._wants else None
        for live, tokens, raw, n_prop, n_acc, position in zip(active, accepted, counts, proposed, n_accepted, positions):
            if self._wants:
                self._tell_outputs(live, len(tokens), heads, hidden)
            emitted = self._append(live, tokens, slots, results)
            if live.shadows:
                before = len(scored)
                self._score(live, slots[live.slot] is not live, scored, grades)
                scored_by += [live.request.index] * (len(scored) - before)
            trace_rows.append({"request": live.request.index, "slot": live.slot, "position": position, "raw": raw,
                               "proposed": n_prop, "accepted": n_acc, "emitted": emitted})
        self.step_count += 1
        end = self.clock()
        host_s = max(0.0, end - step_start - propose_s - verify_s)
        if self._policy_runs:
            self._call_policy("observe", StepOutcome(k, proposed, n_accepted, verify_s, propose_s, host_s,
                                                     tuple(scored), tuple(scored_by), tuple(grades)))
        self.trace({"kind": "step", "step": self.step_count, "t": end - self.t0, "k": k, "batch": self.rows,
                    "propose_s": propose_s, "verify_s": verify_s, "host_s": host_s, "rows": trace_rows})

    def _tell_outputs(self, live: _Live, rows: int, heads, hidden) -> None:
        """Hand the proposer the target's extra outputs for the ``rows`` committed rows."""
        anchor_pos = live.length - 1
        self._call_proposer("on_target_outputs", live.slot, TargetOutputs(
            np.arange(anchor_pos, anchor_pos + rows, dtype=np.int64),
            None if heads is None else np.array(heads[live.slot, :rows]),
            None if hidden is None else np.array(hidden[live.slot, :rows])))

    def _hidden_states(self) -> np.ndarray:
        outputs = getattr(self.session, "outputs", None)
        hidden = outputs().get("hidden_states") if callable(outputs) else None
        if hidden is None:
            raise StageError(f"{self._who()} reads the target's hidden states, but the target session has no "
                             "'hidden_states' output", hint="rebuild the target: spdflow run --from export")
        return hidden

    @staticmethod
    def _score(live: _Live, finished: bool, out: list, grades: list) -> None:
        """Compare the row's open proposals with the tokens it now holds; close the decided ones
        (their (checked, matched) pairs into ``out``, their grades into ``grades``).

        A proposal made when the row held n tokens guessed tokens n, n+1, ...; it is decided at
        its first mismatch (``(matched + 1, matched)``: matched + 1 positions checked) or when
        every token matched. When the request ends first, the positions seen so far are
        reported (``(matched, matched)``). Verified positions score exactly as the acceptor
        decided: accepted tokens are the proposal's own and a correction never equals the
        rejected proposal.
        """
        buffer, length, still_open = live.buffer, live.length, []
        for shadow in live.shadows:
            start, tokens, matched, grade = shadow
            seen = min(len(tokens), length - start)
            while matched < seen and buffer[start + matched] == tokens[matched]:
                matched += 1
            if matched < seen:
                out.append((matched + 1, matched))
                grades.append(grade)
            elif matched == len(tokens) or finished:
                if matched:
                    out.append((matched, matched))
                    grades.append(grade)
            else:
                shadow[2] = matched
                still_open.append(shadow)
        live.shadows = still_open

    def _budget(self, active: list[_Live], waiting: int) -> int:
        """The K policy's proposal budget for this step, within 0..max K."""
        if not self._policy_runs or self.max_k == 0:
            return self.max_k
        step = StepContext(tuple(live.request.max_new_tokens - live.generated for live in active), waiting, self.rows,
                           tuple(live.request.index for live in active))
        budget = self._call_policy("propose_budget", self.max_k, step)
        if not isinstance(budget, int) or not 0 <= budget <= self.max_k:
            raise PluginError(f"the K policy's propose_budget returned {budget!r}; "
                              f"it must be an int in 0..{self.max_k}")
        return budget

    def _k_max(self, live: _Live) -> int:
        left = live.request.max_new_tokens - live.generated - 1
        room = (self.cfg.ctx_len - 2) - (live.length - 1)
        return max(0, min(self.max_k, left, room))

    def _propose(self, active, k_max) -> tuple[list[Proposal], float]:
        if self.proposer is None or not any(k_max.values()):
            return [Proposal.empty() for _ in active], 0.0
        inputs = [ProposeInput(live.slot, live.request.index, read_only_copy(live.tokens), len(live.request.prompt_ids),
                               k_max[live.slot]) for live in active]
        start = self.clock()
        try:
            proposals = self.pm.hook.spdflow_propose(proposer=self.proposer, inputs=inputs)
        except SpdflowError:
            raise
        except Exception as exc:
            raise PluginError(f"{self._who()} failed: {type(exc).__name__}: {exc}") from exc
        elapsed = self.clock() - start
        return self._checked(proposals, inputs), elapsed

    def _checked(self, proposals, inputs) -> list[Proposal]:
        """Proposals must match the inputs one-to-one, fit k_max and stay in the vocabulary;
        draft probabilities must be finite, non-negative [n, vocab] rows. The engine keeps
        read-only copies, so a proposer that changes its arrays later changes nothing."""
        if not isinstance(proposals, list) or len(proposals) != len(inputs):
            raise PluginError(f"{self._who()} returned {type(proposals).__name__} of length "
                              f"{len(proposals) if hasattr(proposals, '__len__') else '?'} for {len(inputs)} requests")
        return [self._checked_one(proposal, item) for proposal, item in zip(proposals, inputs)]

    def _checked_one(self, proposal, item: ProposeInput) -> Proposal:
        where = f"for request {item.request_index}"
        if not isinstance(proposal, Proposal):
            raise PluginError(f"{self._who()} returned a {type(proposal).__name__} {where}; propose() must return Proposal objects")
        try:
            raw = np.asarray(proposal.tokens)
        except (TypeError, ValueError) as exc:
            raise PluginError(f"{self._who()} returned tokens that are not an array {where}: {exc}") from None
        if raw.ndim > 1 or (raw.size and (raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.integer))):
            raise PluginError(f"{self._who()} returned tokens of dtype {raw.dtype} and shape {raw.shape} {where}; "
                              "they must be a 1-D array of integer token ids")
        tokens = raw.astype(np.int64).reshape(-1)  # a copy: the proposer's array is never used again
        if len(tokens) > item.k_max:
            raise PluginError(f"{self._who()} proposed {len(tokens)} tokens where k_max was {item.k_max}")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size):
            raise PluginError(f"{self._who()} proposed a token id outside the vocabulary (0..{self.cfg.vocab_size - 1})")
        tokens.setflags(write=False)
        probs = proposal.probs
        if probs is not None:
            try:
                probs = np.array(probs, dtype=np.float32)
            except (TypeError, ValueError) as exc:
                raise PluginError(f"{self._who()} returned draft probabilities that are not numbers {where}: {exc}") from None
            if probs.shape != (len(tokens), self.cfg.vocab_size):
                raise PluginError(f"{self._who()} returned draft probabilities of shape {probs.shape} {where}; "
                                  f"expected ({len(tokens)}, {self.cfg.vocab_size}): one distribution per proposed token")
            if not np.isfinite(probs).all() or (probs < 0).any():
                raise PluginError(f"{self._who()} returned draft probabilities with NaN, infinite or negative values {where}")
            if len(tokens) and (probs.sum(axis=1) <= 0).any():
                raise PluginError(f"{self._who()} returned a draft distribution that sums to 0 {where}")
            probs.setflags(write=False)
        grade = proposal.grade
        if grade is not None and (isinstance(grade, bool) or not isinstance(grade, (int, np.integer))):
            raise PluginError(f"{self._who()} returned a grade of {grade!r} {where}; "
                              "a proposal's grade must be an int or None")
        return Proposal(tokens, probs, None if grade is None else int(grade))

    def _choose_k(self, counts: list[int], proposals: list[Proposal]) -> int:
        if self.proposer is None:
            return self.ks[0]
        if self._tell_grades:
            self._call_policy("see_grades", [p.grade for p in proposals])
        k = self._call_policy("choose_k", counts, self.ks)
        if k not in self.ks:
            raise PluginError(f"the K policy chose K={k}, which is not compiled (compiled: {self.ks})")
        return k

    def _accept(self, logits, rows) -> list[np.ndarray]:
        """The acceptor's tokens per row, checked against the contract: the accepted proposal
        prefix followed by exactly one target token, every id inside the vocabulary."""
        accepted = self.pm.hook.spdflow_accept(acceptor=self.acceptor, logits=logits, rows=rows, sampling=self.cfg.sampling)
        name = getattr(self.acceptor, "name", "") or type(self.acceptor).__name__
        if not isinstance(accepted, (list, tuple)) or len(accepted) != len(rows):
            raise PluginError(f"acceptor '{name}' returned {type(accepted).__name__} for {len(rows)} rows; "
                              "it must return one token array per row")
        checked = []
        for tokens, row in zip(accepted, rows):
            tokens = np.asarray(tokens)
            proposed = row.proposal.tokens
            if (tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer) or not 1 <= len(tokens) <= len(proposed) + 1
                    or not np.array_equal(tokens[:-1], proposed[: len(tokens) - 1])
                    or tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size):
                raise PluginError(f"acceptor '{name}' returned {tokens.tolist()!r} for a proposal of {len(proposed)} tokens; "
                                  "it must return the accepted proposal prefix plus one target token, all inside the vocabulary")
            checked.append(tokens.astype(np.int64))
        return checked

    def _append(self, live: _Live, tokens: np.ndarray, slots: list, results: dict) -> int:
        """Append accepted tokens, clipped at EOS / max_new_tokens / ctx_len; retire if done."""
        tokens = np.asarray(tokens, dtype=np.int64)
        reason = None
        if self.eos:
            for i, token in enumerate(tokens.tolist()):
                if token in self.eos:
                    tokens = tokens[: i + 1]
                    reason = "eos"
                    break
        left = live.request.max_new_tokens - live.generated
        if len(tokens) >= left:
            tokens = tokens[:left]
            reason = reason or "max_new_tokens"
        n = len(tokens)
        live.buffer[live.length : live.length + n] = tokens
        live.length += n
        live.generated += n
        if reason is None and live.length >= self.cfg.ctx_len:
            reason = "ctx_len"
        if self._tell_accepted:
            self._call_proposer("on_accepted", live.slot, read_only_copy(tokens))
        self.on_tokens(n)
        if reason is not None:
            self._retire(live, reason, slots, results)
        return n

    def _retire(self, live: _Live, reason: str, slots: list, results: dict) -> None:
        now = self.clock() - self.t0
        results[live.request.index] = RequestResult(live.request.index, live.tokens[len(live.request.prompt_ids):].copy(),
                                                    reason, len(live.request.prompt_ids), live.ttft_s, now)
        self.trace({"kind": "request", "request": live.request.index, "prompt_tokens": len(live.request.prompt_ids),
                    "generated_tokens": live.generated, "ttft_s": live.ttft_s, "finish_s": now, "stop_reason": reason})
        slots[live.slot] = None
        if self.proposer is not None:
            self._call_proposer("remove_request", live.slot)

    def _who(self) -> str:
        """The proposer named for error messages, with its plugin and version when known."""
        label = f"proposer '{self.proposer_name}'"
        return f"{label} ({self.proposer_plugin})" if self.proposer_plugin else label

    def _call_policy(self, method: str, *args):
        try:
            return getattr(self.policy, method)(*args)
        except SpdflowError:
            raise
        except Exception as exc:
            name = getattr(self.policy, "name", "") or type(self.policy).__name__
            raise PluginError(f"K policy '{name}' failed in {method}: {type(exc).__name__}: {exc}") from exc

    def _call_proposer(self, method: str, *args) -> None:
        try:
            getattr(self.proposer, method)(*args)
        except SpdflowError:
            raise
        except Exception as exc:
            raise PluginError(f"{self._who()} failed in {method}: {type(exc).__name__}: {exc}") from exc
