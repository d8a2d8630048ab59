"""The oracle K schedule of a greedy run, and how far a K policy is from it.

Greedy SpD is lossless, so the run's outputs fix the token path whatever K is verified. At
every point of that path the proposer's proposal is fixed too (it depends only on the tokens so
far), so how many tokens a verify at K would accept there is known: ``min(K, m)``, with ``m``
the length of the proposal's prefix that equals the recorded continuation
(:func:`match_lengths`). Knowing ``m`` at every point, the fastest schedule — the K of every
step — is a shortest path priced by a cost model:

* one row at a time (batch 1) it is solved exactly by dynamic programming over points and the
  previous K (:func:`best_schedule`);
* in a batch one K per step is shared by every row, and rows end and are refilled as the
  generation loop does; :func:`batch_schedule` searches the states keyed by the rows' points
  and the previous K, exact while at most ``width`` states are open per step, else a beam of
  that width — then it is the best schedule found, a lower bound on the true oracle's speed, and
  the output says so ("oracle (best found, beam W)").

Beside it, priced by the same cost model:

* ``policy efficiency`` = the policy's tokens/s ÷ the oracle's (above 1 only when the oracle
  is a beam's best found), and
* ``regret`` = the policy's tokens/s ÷ max(no-spec, the best fixed K of the list) − 1.

``spdflow whatif --oracle`` replays the policy and the static choices (:func:`oracle_report`);
``spdflow bench`` and the run report price the runs' own traces (:func:`trace_oracle`).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from spdflow.api import CostModel, ProposeInput, Request
from spdflow.costs import MIN_STEPS, level_scale, spells
from spdflow.errors import UsageError


def match_lengths(pm, requests: Sequence[Request], outputs: dict, proposer, budgets: Sequence[int],
                  ctx_len: int) -> tuple[dict[int, dict[int, np.ndarray]], float, int]:
    """``m_b(e)`` for every request, every proposal budget ``b`` of ``budgets`` and every point
    ``e`` (tokens emitted, 1 ≤ e < n) of its recorded output: how many leading tokens of the
    proposal made there with budget ``b`` equal what followed. The budget is the generation
    loop's (``b``, clipped by the tokens the request may still emit and by the context), since
    a proposer may choose differently for another budget (prompt lookup prefers the match with
    the longest continuation it may use). Requests are fed in order, one token at a time, as a
    no-spec run would, once per budget. Also returns the proposer's total seconds and number of
    calls (its time per step)."""
    out: dict[int, dict[int, np.ndarray]] = {r.index: {} for r in requests}
    seconds, calls = 0.0, 0
    for b in sorted({int(b) for b in budgets if b > 0}):
        for request in requests:
            output = np.asarray(outputs[request.index], dtype=np.int64)
            prompt = np.asarray(request.prompt_ids, dtype=np.int64)
            n = len(output)
            m = np.zeros(max(n, 1), dtype=np.int64)
            proposer.add_request(0, request)
            if n:
                proposer.on_accepted(0, output[:1].copy())
            context = np.concatenate([prompt, output])
            for e in range(1, n):
                if n - e - 1 <= 0:
                    break
                budget = min(b, request.max_new_tokens - e - 1, ctx_len - 1 - len(prompt) - e)
                if budget > 0:
                    tokens = context[: len(prompt) + e].copy()
                    tokens.setflags(write=False)
                    start = time.perf_counter()
                    proposal = pm.hook.spdflow_propose(proposer=proposer, inputs=[ProposeInput(
                        0, request.index, tokens, len(prompt), budget)])[0]
                    seconds += time.perf_counter() - start
                    calls += 1
                    drafted = np.asarray(proposal.tokens, dtype=np.int64)[:budget]
                    truth = output[e: e + len(drafted)]
                    same = drafted[: len(truth)] == truth
                    m[e] = min(len(same) if same.all() else int(np.argmin(same)), n - e - 1)
                proposer.on_accepted(0, output[e: e + 1].copy())
            proposer.remove_request(0)
            out[request.index][b] = m
    return out, seconds, calls


def best_schedule(m: np.ndarray, n: int, ks: list[int], cost: CostModel) -> tuple[float, list[int]]:
    """Least decode time from point 1 (the prefill gave the first token) to ``n`` and the K of
    each step on that path. A step at K from point e emits min(K, m(e), n − e − 1) + 1 tokens and
    costs ``verify_s(1, K)``, plus ``switch_s(1)`` when K differs from the previous step's — and
    on the first step, which follows a prefill (as the replay prices it)."""
    if n <= 1:
        return 0.0, []
    verify = {k: cost.verify_s(1, k) for k in ks}
    switch = cost.switch_s(1)
    col = {k: i for i, k in enumerate(ks)}

    def advance(e: int, k: int) -> int:
        return e + min(k, int(m[e]), n - e - 1) + 1

    # best[e, j]: least time from point e to n when the previous step verified ks[j]
    best = np.full((n + 1, len(ks)), np.inf)
    choice = np.zeros((n + 1, len(ks)), dtype=np.int64)
    best[n, :] = 0.0
    for e in range(n - 1, 0, -1):
        for j, previous in enumerate(ks):
            for k in ks:
                t = verify[k] + (switch if k != previous else 0.0) + best[advance(e, k), col[k]]
                if t < best[e, j]:
                    best[e, j], choice[e, j] = t, k
    first = min(ks, key=lambda k: verify[k] + switch + best[advance(1, k), col[k]])
    total = verify[first] + switch + best[advance(1, first), col[first]]
    schedule, e, k = [first], advance(1, first), first
    while e < n:
        k = int(choice[e, col[k]])
        schedule.append(k)
        e = advance(e, k)
    return float(total), schedule


# ------------------------------------------------------------------------------ batch > 1

#: states a beam keeps per step count (see :func:`batch_schedule`)
DEFAULT_WIDTH = 64
#: the previous step's K after a prefill: the next decode pays a switch whatever its K
AFTER_PREFILL = -1


@dataclass
class StepPrices:
    """What one decode step costs at one batch size: ``step[K]`` the verify run of K (and any
    host and proposer work charged per step at that K), ``switch`` the extra time of a step whose
    K differs from the previous step's or that follows a prefill."""

    step: dict[int, float]
    switch: float
    #: a recorded K = 0 step whose proposer ran (a policy drafted, then verified none of it): it pays
    #: the drafting step's host and proposer work, not a no-spec step's (None: ``step[0]``)
    zero_drafting: float | None = None


@dataclass
class Found:
    """A schedule of a whole workload (or a static group) and its decode time."""

    seconds: float
    schedule: list[int]
    #: True when the search proved it optimal (no state was dropped for the beam width)
    exact: bool

    @property
    def steps(self) -> int:
        return len(self.schedule)


class _Work:
    """A workload as the search sees it: per request its length ``n`` and, per action, how many
    proposal tokens a step would accept at each point.

    An action is a K verified with proposals drafted for a budget ``b ≥ K`` (then cut to K, as
    the loop does when a policy drafts more than it verifies): ``ms[i]`` is one array when the
    proposer's proposals do not depend on the budget (each K its own action), or ``{b: m_b}``
    from :func:`match_lengths` (one action per K and budget b ≥ K of the list; K = 0 drafts
    nothing). Fixed K = k is the action (k, k)."""

    def __init__(self, ms, ns: Sequence[int], ks: Sequence[int]):
        self.ks = sorted(set(ks))
        self.ns = [int(n) for n in ns]
        budgets = sorted(set(ms[0]) if ms and isinstance(ms[0], dict) else [])
        if budgets:
            missing = [k for k in self.ks if k > 0 and k not in budgets]
            if missing:
                raise ValueError(f"match lengths have no budget {missing[0]}")
            self.actions = [(k, b if k > 0 else 0) for k in self.ks for b in (budgets if k > 0 else [0]) if b >= k]
        else:
            self.actions = [(k, 0) for k in self.ks]
        self.acc: list[list[list[int]]] = []
        for m, n in zip(ms, self.ns):
            rows = []
            for k, b in self.actions:
                own = (m[b] if b else np.zeros(max(n, 1), dtype=np.int64)) if budgets else np.asarray(m)
                room = np.maximum(n - 1 - np.arange(max(n, 1)), 0)  # never past the end
                rows.append(np.minimum(np.minimum(own[:max(n, 1)], k), room).tolist())
            self.acc.append(rows)

    def action_of(self, k: int) -> int:
        """The action of fixed K = ``k``."""
        return next(a for a, (kk, b) in enumerate(self.actions) if kk == k and (b == k or k == 0 or b == 0))


def _row_table(work: _Work, i: int, prices: StepPrices) -> np.ndarray:
    """``table[e, j]``: least time to take request ``i`` alone from point ``e`` to its end when
    the previous step verified ``ks[j]`` (the last column: after a prefill), with the batch's
    step prices. A shared schedule is a feasible schedule for each of its rows, so this bounds
    the batch's time from below (:func:`batch_schedule`'s heuristic)."""
    ks, n, acc = work.ks, work.ns[i], work.acc[i]
    column = {k: j for j, k in enumerate(ks)}
    width = len(ks)
    table = np.zeros((max(n, 1) + 1, width + 1))
    for e in range(n - 1, 0, -1):
        cand = np.full(width, np.inf)  # best per K of the step
        for a, (k, _) in enumerate(work.actions):
            j = column[k]
            cand[j] = min(cand[j], prices.step[k] + table[min(e + acc[a][e] + 1, n), j])
        best = cand.min() + prices.switch
        table[e, :width] = np.minimum(cand, best)
        table[e, width] = best
    return table


def batch_schedule(ms, ns: Sequence[int], rows: int, continuous: bool, ks: Sequence[int],
                   prices: StepPrices, width: int = DEFAULT_WIDTH) -> Found:
    """The fastest K schedule of a workload at batch ``rows``, found in hindsight.

    The mechanics are the generation loop's (:class:`spdflow.engine.generate.Generator`): requests
    are admitted in order; without continuous batching a group of ``rows`` requests is prefilled
    once every slot is free, under continuous batching every free slot is refilled before the
    next step; a step verifies one K for every row, a row at point ``e`` emits
    ``min(K, m(e), n − e − 1) + 1`` tokens (``ms``/``ns`` per request, see :class:`_Work`),
    finished rows idle. A step costs ``prices.step[K]``, plus ``prices.switch`` when K changed or a
    prefill came between (prefills themselves cost the same in every schedule and are left out).

    One row (batch 1, or a static group of one request) is solved exactly by dynamic
    programming. Otherwise the search runs step by step over states keyed by the row positions
    (which requests are in the batch and where), the next waiting request and the previous K,
    keeping a state only when it is reached faster than before (exact), and dropping states
    whose time so far plus a lower bound of the rest (the slowest row alone, or every row's own
    best time shared over ``rows`` slots) cannot beat the best schedule already found — that
    starts as the best single K, so the result is never slower than any fixed K or no-spec.
    When more than ``width`` states remain at a step, the ``width`` most promising (least time
    so far plus bound) are kept: the result is then the best schedule found (a feasible
    schedule: a lower bound on the true oracle's speed), and ``exact`` is False. Static groups
    are independent (each starts after a prefill) and are searched one at a time.
    """
    work = _Work(ms, ns, ks)
    ns = work.ns
    tables = [_row_table(work, i, prices) for i in range(len(ns))]
    if continuous and rows > 1:
        return _search(work, tables, list(range(len(ns))), rows, True, prices, width)
    total, schedule, exact = 0.0, [], True
    size = 1 if continuous else rows
    for start in range(0, len(ns), size):
        group = list(range(start, min(start + size, len(ns))))
        live = [i for i in group if ns[i] > 1]
        if len(live) == 1:
            found = _one_row(work, live[0], tables[live[0]], prices)
        elif live:
            found = _search(work, tables, group, rows, False, prices, width)
        else:
            continue
        total += found.seconds
        schedule += found.schedule
        exact = exact and found.exact
    return Found(total, schedule, exact)


def _one_row(work: _Work, i: int, table: np.ndarray, prices: StepPrices) -> Found:
    """Read the one-row optimum off its table."""
    ks, n, acc = work.ks, work.ns[i], work.acc[i]
    column = {k: j for j, k in enumerate(ks)}
    schedule, e, previous = [], 1, len(ks)
    while e < n:
        options = []
        for a, (k, _) in enumerate(work.actions):
            nxt = min(e + acc[a][e] + 1, n)
            j = column[k]
            options.append((prices.step[k] + (0.0 if j == previous else prices.switch) + table[nxt, j], nxt, j))
        _, e, previous = min(options, key=lambda option: option[0])
        schedule.append(ks[previous])
    return Found(float(table[1, len(ks)]), schedule, True)


class _Batch:
    """The loop's batch mechanics over the requests ``order`` (see :func:`batch_schedule`)."""

    def __init__(self, work: _Work, order: list[int], rows: int, continuous: bool):
        self.work, self.order, self.rows, self.continuous = work, order, rows, continuous

    def admit(self, active: tuple, waiting: int, previous: int) -> tuple[tuple, int, int]:
        """Fill free slots as the loop does before a step (static: only once every slot is free)."""
        order, ns = self.order, self.work.ns
        while waiting < len(order) and (len(active) < self.rows if self.continuous else not active):
            taken = order[waiting: waiting + self.rows - len(active)]
            waiting += len(taken)
            active = tuple(sorted(active + tuple((i, 1) for i in taken if ns[i] > 1)))
            previous = AFTER_PREFILL
            if active:  # else every admitted request ended at its prefill: admit again
                break
        return active, waiting, previous

    def start(self) -> tuple[tuple, int, int]:
        return self.admit((), 0, AFTER_PREFILL)

    def step(self, state: tuple, action: int) -> tuple[tuple, int, int]:
        """The state after one step of ``action`` (and the admissions before the next)."""
        active, waiting, _ = state
        acc, ns = self.work.acc, self.work.ns
        moved = []
        for i, e in active:
            e += acc[i][action][e] + 1
            if e < ns[i]:
                moved.append((i, e))
        return self.admit(tuple(moved), waiting, self.work.actions[action][0])

    def fixed(self, k: int, prices: StepPrices) -> tuple[float, list[int]]:
        """Time and schedule of K = ``k`` at every step."""
        action = self.work.action_of(k)
        total, schedule = 0.0, []
        state = self.start()
        while state[0]:
            total += prices.step[k] + (prices.switch if state[2] != k else 0.0)
            state = self.step(state, action)
            schedule.append(k)
        return total, schedule


def fixed_time(ms, ns, rows: int, continuous: bool, k: int, prices: StepPrices, ks: Sequence[int] | None = None) -> Found:
    """The decode time of K = ``k`` at every step (no-spec: ``k`` = 0), by the same mechanics and
    prices as :func:`batch_schedule`."""
    work = _Work(ms, ns, ks or [0, k])
    seconds, schedule = _Batch(work, list(range(len(ns))), rows, continuous).fixed(k, prices)
    return Found(seconds, schedule, True)


def _search(work: _Work, tables, order: list[int], rows: int, continuous: bool, prices: StepPrices,
            width: int) -> Found:
    """Step-by-step search over (rows in the batch with their points, next waiting request,
    previous K) for the requests ``order`` (see :func:`batch_schedule`)."""
    if width < 1:
        raise UsageError("the oracle's beam width must be at least 1")
    ks = work.ks
    batch = _Batch(work, order, rows, continuous)
    column = {k: j for j, k in enumerate(ks)}
    column[AFTER_PREFILL] = len(ks)
    full = [float(t[1, -1]) for t in tables]  # a waiting request's own best time, from its prefill
    switch = prices.switch

    def bound(active: tuple, waiting: int, previous: int) -> float:
        """A lower bound of the time left: no row finishes faster than alone, and at most
        ``rows`` rows share a step."""
        j = column[previous]
        own = [float(tables[i][e, j]) for i, e in active]
        rest = sum(full[i] for i in order[waiting:])
        return max(max(own, default=0.0), (sum(own) + rest) / rows)

    best_time, best_schedule = min((batch.fixed(k, prices) for k in ks), key=lambda found: found[0])
    best_node = None  # None: the best is a fixed K (best_schedule)
    start = batch.start()
    seen = {start: 0.0}
    nodes: list[tuple[int, int]] = [(-1, 0)]  # (parent node, K): the schedules as a tree
    frontier = [(0.0, start, 0)]
    exact = True
    tolerance = 1e-12 * max(1.0, best_time)
    while frontier:
        children: dict[tuple, tuple[float, float, int, int]] = {}
        for g, state, node in frontier:
            if g > seen.get(state, np.inf):
                continue  # reached faster since
            previous = state[2]
            for action, (k, _) in enumerate(work.actions):
                cost = g + prices.step[k] + (switch if previous != k else 0.0)
                after = batch.step(state, action)
                if not after[0]:
                    if cost < best_time - tolerance:
                        nodes.append((node, k))
                        best_time, best_node = cost, len(nodes) - 1
                    continue
                if cost >= seen.get(after, np.inf):
                    continue
                f = cost + bound(*after)
                if f >= best_time - tolerance:
                    continue
                seen[after] = cost
                children[after] = (f, cost, node, k)
        ranked = sorted(children.items(), key=lambda item: item[1][0])
        if len(ranked) > width:
            exact = False
            ranked = ranked[:width]
        frontier = []
        for state, (f, cost, node, k) in ranked:
            if f >= best_time - tolerance:
                continue
            nodes.append((node, k))
            frontier.append((cost, state, len(nodes) - 1))
    if best_node is None:
        return Found(best_time, best_schedule, exact)
    schedule, node = [], best_node
    while node > 0:
        parent, k = nodes[node]
        schedule.append(k)
        node = parent
    return Found(best_time, schedule[::-1], exact)


@dataclass
class OracleSchedule:
    """The best schedule found of a whole run at one batch size."""

    #: decode time: verify runs, switches and the per-step host and proposer work priced
    decode_s: float
    steps: int
    k_usage: dict[int, int]
    batch_size: int
    exact: bool
    width: int

    def label(self) -> str:
        """How the oracle is named in output: exact, or a beam's best found."""
        return "oracle" if self.exact else f"oracle (best found, beam {self.width})"


def usage(schedule: Sequence[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for k in schedule:
        counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items()))


def lengths_for(pm, engine, info, requests, outputs: dict,
                budgets: Sequence[int]) -> tuple[dict[int, dict[int, np.ndarray]], float, int]:
    """:func:`match_lengths` with a fresh greedy proposer of ``engine``'s recipe."""
    from spdflow.api import Sampling

    proposer = engine.make_proposer(info, Sampling(0.0, None, None), dict(outputs))
    try:
        return match_lengths(pm, requests, outputs, proposer, budgets, engine.recipe.specialization.ctx_len)
    finally:
        proposer.close()


def check_oracle_run(recipe) -> None:
    """One sentence when a run has no oracle: sampled, or without a proposer."""
    if recipe.workload.temperature != 0:
        raise UsageError("the oracle needs a greedy run (temperature 0): a sampled run's token path depends on the "
                         "schedule")
    if recipe.proposer is None:
        raise UsageError("the oracle needs a run with a proposer: without one every step is K = 0")


def oracle(pm, run, cost: CostModel, ks: list[int] | None = None, batch_size: int | None = None,
           overhead: dict[int, float] | None = None, width: int = DEFAULT_WIDTH) -> tuple[OracleSchedule, float, int]:
    """The best schedule found of ``run`` over ``ks`` (default: the run's K-list) at
    ``batch_size`` (default: the run's), each step priced ``cost.verify_s`` plus ``overhead[K]``
    (host and proposer seconds per step at K, default none) and ``cost.switch_s``; also the
    proposer's seconds and calls (see :func:`match_lengths`)."""
    from spdflow.engine.run import Engine, NullUI, RunOptions

    check_oracle_run(run.recipe)
    ks = sorted(set(ks or run.recipe.k_list()) | {0})
    batch = batch_size or run.batch_size
    engine = Engine(pm, run.loaded, RunOptions(), NullUI())
    try:
        lengths, seconds, calls = lengths_for(pm, engine, run.model_info, run.requests, run.outputs, ks)
    finally:
        engine.close_sessions()
    prices = StepPrices({k: cost.verify_s(batch, k) + (overhead or {}).get(k, 0.0) for k in ks}, cost.switch_s(batch))
    ms = [lengths[r.index] for r in run.requests]
    ns = [len(run.outputs[r.index]) for r in run.requests]
    continuous = run.recipe.specialization.full_batch_size is not None
    found = batch_schedule(ms, ns, batch, continuous, ks, prices, width)
    return OracleSchedule(found.seconds, found.steps, usage(found.schedule), batch, found.exact, width), seconds, calls


@dataclass
class OracleReport:
    """The oracle beside the policy, no-spec and every fixed K, all priced by one cost model."""

    oracle_tokens_per_s: float
    oracle_steps: int
    oracle_k_usage: dict[int, int]
    policy: str
    policy_tokens_per_s: float
    nospec_tokens_per_s: float
    fixed_tokens_per_s: dict[int, float]
    efficiency: float  # policy ÷ oracle
    regret: float  # policy ÷ max(no-spec, best fixed K) − 1
    batch_size: int = 1
    exact: bool = True
    width: int = DEFAULT_WIDTH

    @property
    def oracle_label(self) -> str:
        return "oracle" if self.exact else f"oracle (best found, beam {self.width})"

    def to_json(self) -> dict:
        return {"batch_size": self.batch_size, "oracle": self.oracle_label, "oracle_exact": self.exact,
                "oracle_tokens_per_s": self.oracle_tokens_per_s, "oracle_steps": self.oracle_steps,
                "oracle_k_usage": {str(k): v for k, v in self.oracle_k_usage.items()}, "policy": self.policy,
                "policy_tokens_per_s": self.policy_tokens_per_s, "nospec_tokens_per_s": self.nospec_tokens_per_s,
                "fixed_tokens_per_s": {str(k): v for k, v in self.fixed_tokens_per_s.items()},
                "policy_efficiency": self.efficiency, "regret_vs_best_static": self.regret}


def oracle_report(pm, run, cost: CostModel, policy: str | None = None, batch_size: int | None = None,
                  width: int = DEFAULT_WIDTH) -> OracleReport:
    """Replay the run's policy, no-spec and each fixed K of its list at ``batch_size`` (default:
    the run's), and find the oracle, all with ``cost``.

    Outside the verify runs, an oracle step at K costs what a step cost in the replay of fixed K
    (no-spec for K = 0: no proposer runs) — host and proposer time per step — and the prefills
    cost what they cost in the no-spec replay. Every static choice is among the schedules the
    oracle weighs; should one still replay faster (host time is measured, so it varies a
    little), the oracle is that choice at its replayed speed: never slower than a static choice.
    """
    from spdflow.recipe.schema import REFERENCE_POLICY
    from spdflow.whatif import Scenario, prepare, replay

    check_oracle_run(run.recipe)
    batch = batch_size or run.batch_size
    ks = sorted(set(run.recipe.k_list()) | {0})
    policy = policy or run.recipe.k_policy.uses
    # a one-K list leaves any policy one choice: K-list [0] is no-spec, [k] is fixed K = k
    scenarios = [Scenario(tuple(ks), policy, batch), Scenario((0,), REFERENCE_POLICY, batch)]
    scenarios += [Scenario((k,), REFERENCE_POLICY, batch) for k in ks if k > 0]
    prepare(cost, scenarios)
    figures = [replay(pm, run, s, cost).figures for s in scenarios]
    mine, nospec, fixed = figures[0], figures[1], figures[2:]
    static = {0: nospec, **{s.k_list[0]: f for s, f in zip(scenarios[2:], fixed)}}
    overhead = {k: (f.host_s + f.propose_s) / f.steps if f.steps else 0.0 for k, f in static.items()}
    best, _, _ = oracle(pm, run, cost, ks, batch, overhead, width)
    outside = nospec.wall_s - nospec.verify_s - nospec.host_s - nospec.propose_s
    wall = min([outside + best.decode_s, *(f.wall_s for f in static.values())])
    oracle_tps = mine.generated_tokens / wall
    fixed_tps = {k: f.tokens_per_s for k, f in static.items() if k > 0}
    best_static = max([nospec.tokens_per_s, *fixed_tps.values()])
    return OracleReport(oracle_tps, best.steps, best.k_usage, policy, mine.tokens_per_s, nospec.tokens_per_s,
                        fixed_tps, mine.tokens_per_s / oracle_tps, mine.tokens_per_s / best_static - 1, batch,
                        best.exact, width)


# ------------------------------------------------------------------------------ a generation's own trace


class MeasuredSteps(CostModel):
    """Step costs of one batch size as a generation measured them: the mean verify time of each
    K its traces ran at least :data:`MIN_STEPS` times (the mean: a throughput is a sum of step
    times); a K run less often takes the median a timed grid (:func:`spdflow.costs.measure_grid`
    on the same session) gives, scaled by the median ratio of trace mean to grid median over the
    K both have (the grid's runs sit outside a generation and time differently, so only its
    shape across K is used); the switch cost from the grid, scaled alike (0 without a grid).
    Verify runs only: the host and proposer time per step are the traces' own
    (:func:`trace_oracle`)."""

    name = "measured steps"

    def __init__(self, batch: int, traces: Sequence[Sequence[dict]], grid=None):
        self.batch, self.grid = batch, grid
        times: dict[int, list[float]] = {}
        for records in traces:
            for r in records:
                if r.get("kind") == "step":
                    times.setdefault(int(r["k"]), []).append(float(r["verify_s"]))
        self.own = {k: statistics.fmean(v) for k, v in times.items() if len(v) >= MIN_STEPS}
        self.counts = {k: len(v) for k, v in times.items()}
        #: trace time ÷ grid time, applied to what only the grid gives
        self.scale = level_scale(self.own, grid.verify_s) if grid is not None else 1.0

    def verify_s(self, batch, k):
        if k in self.own:
            return self.own[k]
        if self.grid is not None and k in self.grid.verify_s:
            return self.grid.verify_s[k] * self.scale
        raise UsageError(f"no measured step cost for K = {k} at batch {batch}")

    def switch_s(self, batch):
        return self.grid.switch_s * self.scale if self.grid is not None else 0.0

    def sources(self) -> dict[str, str]:
        return {str(k): (f"mean of {self.counts[k]} steps" if k in self.own else f"grid × {self.scale:.3f}")
                for k in sorted(set(self.own) | set(self.grid.verify_s if self.grid is not None else ()))}

    def describe(self):
        return {"cost_model": self.name, "batch": self.batch, "sources": self.sources(),
                "verify_ms": {str(k): round(self.verify_s(self.batch, k) * 1e3, 4) for k in sorted(
                    set(self.own) | set(self.grid.verify_s if self.grid is not None else ()))},
                "switch_ms": round(self.switch_s(self.batch) * 1e3, 4)}


def _steps(records: Sequence[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "step"]


def outside_s(records: Sequence[dict]) -> float:
    """Wall time outside the decode steps (prefills, one-off setup), from a trace."""
    from spdflow.report.metrics import compute_metrics

    m = compute_metrics(list(records))
    inside = sum(float(s["verify_s"]) + float(s.get("host_s", 0.0)) + float(s.get("propose_s", 0.0))
                 for s in _steps(records))
    return max(0.0, m.wall_s - inside)


def priced_decode_s(records: Sequence[dict], prices: StepPrices) -> float:
    """The decode time of a recorded generation's K schedule, each step priced by ``prices`` (the
    oracle's: verify, host and proposer time per step at K, and a switch when K changed or a
    prefill came between). The run's own host and proposer times are not used: priced alike, no
    schedule can beat the oracle's by luck of timing (a policy's own overhead is in its measured
    tokens/s)."""
    drafted = prices.zero_drafting
    return sum((drafted if k == 0 and drafted is not None and float(r.get("propose_s", 0.0)) > 0 else prices.step[k])
               + (prices.switch if since == 0 else 0.0) for k, since, r in spells(records))


@dataclass
class TraceOracle:
    """The oracle of a generation and the static choices, priced by one cost model; what a
    K-list policy's recorded run is measured against (:meth:`against`)."""

    batch_size: int
    tokens: int
    outside_s: float
    cost: CostModel
    found: Found
    static_s: dict[int, float]  # decode seconds of K = k at every step (0: no-spec)
    width: int
    seconds: float  # what computing it took (match lengths + search), not part of any run's time
    prices: StepPrices  # what every schedule's steps are priced at (the oracle's, the static ones', a policy's)

    @property
    def label(self) -> str:
        return "oracle" if self.found.exact else f"oracle (best found, beam {self.width})"

    def tokens_per_s(self, decode_s: float) -> float:
        return self.tokens / (self.outside_s + decode_s)

    @property
    def oracle_tokens_per_s(self) -> float:
        return self.tokens_per_s(self.found.seconds)

    @property
    def best_static(self) -> tuple[int, float]:
        """(K, tokens/s) of the fastest static choice (K = 0: no-spec)."""
        k = min(self.static_s, key=lambda k: (self.static_s[k], k))
        return k, self.tokens_per_s(self.static_s[k])

    def against(self, records: Sequence[dict]) -> dict:
        """The oracle figures for one recorded run of a policy (same workload and batch size)."""
        policy = self.tokens_per_s(priced_decode_s(records, self.prices))
        k, static = self.best_static
        return {"policy_priced_tokens_per_s": policy, "policy_efficiency": policy / self.oracle_tokens_per_s,
                "regret_vs_best_static": policy / static - 1}

    def to_json(self) -> dict:
        k, static = self.best_static
        return {"oracle": self.label, "oracle_exact": self.found.exact, "beam_width": self.width,
                "oracle_tokens_per_s": self.oracle_tokens_per_s, "oracle_steps": self.found.steps,
                "oracle_k_usage": {str(k): v for k, v in usage(self.found.schedule).items()},
                "nospec_priced_tokens_per_s": self.tokens_per_s(self.static_s[0]) if 0 in self.static_s else None,
                "fixed_priced_tokens_per_s": {str(k): self.tokens_per_s(s) for k, s in self.static_s.items() if k},
                "best_static": "no-spec" if k == 0 else f"fixed K={k}", "best_static_tokens_per_s": static,
                "cost": self.cost.describe(), "oracle_seconds": self.seconds}


def host_apart(steps: Sequence[dict]) -> tuple[float, float, float]:
    """Mean host seconds of the decode ``steps`` whose proposer did not run and of those whose proposer
    ran (either the mean of every step where fewer than :data:`MIN_STEPS` are of its kind), and the
    mean proposer seconds per drafting step. A step without the proposer does less host work: on
    synthetic 0.3 at batch 4 goodput's took 0.16 ms against 0.31 with it (issue 23, round 29)."""

    def mean_host(of: Sequence[dict]) -> float:
        return statistics.fmean(float(s.get("host_s", 0.0)) for s in of) if of else 0.0

    drafting = [s for s in steps if float(s.get("propose_s", 0.0)) > 0]
    idle = [s for s in steps if float(s.get("propose_s", 0.0)) <= 0]
    propose = statistics.fmean(float(s["propose_s"]) for s in drafting) if drafting else 0.0
    return (mean_host(idle if len(idle) >= MIN_STEPS else steps),
            mean_host(drafting if len(drafting) >= MIN_STEPS else steps), propose)


def step_overheads(traces: Sequence[Sequence[dict]], ks: Sequence[int],
                   static: dict[int, Sequence[Sequence[dict]]] | None = None) -> dict[int, float]:
    """Host and proposer seconds a decode step at each K costs outside its verify run.

    From ``static`` (per K, the traces of runs that held that K: no-spec for K = 0, fixed K for
    K > 0) where it has :data:`MIN_STEPS` steps at K: their mean host plus proposer time per
    step, as ``spdflow whatif``'s oracle charges (:func:`oracle_report`). Otherwise from every
    step of ``traces`` (:func:`host_apart`): K = 0 the host time of the steps whose proposer did not
    run, K > 0 of those whose proposer ran plus the mean proposer time per drafting step. One mean
    of every step for every K priced no-spec's steps at the drafting ones' host work."""
    idle, busy, propose = host_apart([s for records in traces for s in _steps(records)])
    overhead = {}
    for k in sorted(set(ks)):
        held = [s for records in (static or {}).get(k, ()) for s in _steps(records) if int(s["k"]) == k]
        if len(held) >= MIN_STEPS:
            overhead[k] = statistics.fmean(float(s.get("host_s", 0.0)) + float(s.get("propose_s", 0.0)) for s in held)
        else:
            overhead[k] = idle if k == 0 else busy + propose
    return overhead


def trace_oracle(pm, engine, info, requests, outputs: dict, ks: Sequence[int], rows: int, continuous: bool,
                 traces: Sequence[Sequence[dict]], cost: CostModel, width: int = DEFAULT_WIDTH,
                 static: dict[int, Sequence[Sequence[dict]]] | None = None) -> TraceOracle:
    """The oracle of a greedy workload whose tokens are ``outputs`` over the K-list ``ks`` (no-spec
    among the static choices only when it holds 0), priced like its recorded ``traces`` (one or
    more generations at batch ``rows``): verify runs by ``cost``, and per step at K the host and
    proposer time of :func:`step_overheads` (from ``static``, the static runs' traces per K, where
    given; an oracle step at K = 0 drafts nothing); a recorded K = 0 step whose proposer ran pays the
    smallest K > 0's (:attr:`StepPrices.zero_drafting`); the time outside the steps (prefills) is
    the traces' median. ``engine`` makes the proposer (:func:`lengths_for`)."""
    started = time.perf_counter()
    ks = sorted(set(ks))
    lengths, _, _ = lengths_for(pm, engine, info, requests, outputs, ks)
    overhead = step_overheads(traces, ks, static)
    drafting = [k for k in ks if k > 0]
    zero_drafting = cost.verify_s(rows, 0) + overhead[drafting[0]] if 0 in ks and drafting else None
    prices = StepPrices({k: cost.verify_s(rows, k) + overhead[k] for k in ks}, cost.switch_s(rows), zero_drafting)
    ms = [lengths[r.index] for r in requests]
    ns = [len(outputs[r.index]) for r in requests]
    found = batch_schedule(ms, ns, rows, continuous, ks, prices, width)
    static = {k: fixed_time(ms, ns, rows, continuous, k, prices, ks).seconds for k in ks}
    outside = statistics.median(outside_s(records) for records in traces) if traces else 0.0
    return TraceOracle(rows, sum(ns), outside, cost, found, static, width, time.perf_counter() - started, prices)


def run_oracle(engine, info, requests, outputs: dict, records: list[dict], config, grid, speculated: bool) -> dict:
    """The run report's oracle section (:class:`spdflow.report.model.OracleSection`) for a
    finished generation: computed from the run's own trace, outputs and timed grid, or why
    not. Never raises: a report must not fail over it."""
    recipe = engine.recipe
    temperature = config.sampling.temperature
    if temperature != 0:
        return {"computed": False, "reason": f"sampled run (temperature {temperature}): its token path depends on the K "
                                             "schedule, so there is no best schedule in hindsight"}
    if recipe.proposer is None or not speculated:
        return {"computed": False, "reason": "no proposer ran: every step verified K = 0"}
    needs = getattr(engine.pm.lookup("proposer", recipe.proposer.uses).factory, "target_outputs", ()) or ()
    if needs:
        return {"computed": False, "reason": f"proposer '{recipe.proposer.uses}' drafts from the target's "
                                             f"{' and '.join(needs)}, which the run does not record"}
    rows = config.full_batch_size or config.batch_size
    try:
        cost = MeasuredSteps(rows, [records], grid)
        oracle = trace_oracle(engine.pm, engine, info, requests, outputs, config.k_list, rows,
                              config.full_batch_size is not None, [records], cost)
    except Exception as exc:  # e.g. a K with no step cost
        return {"computed": False, "reason": f"not computed: {exc}"}
    mine = oracle.against(records)
    k, static = oracle.best_static
    return {"computed": True, "label": oracle.label, "exact": oracle.found.exact, "beam_width": oracle.width,
            "batch_size": rows, "oracle_tokens_per_s": oracle.oracle_tokens_per_s, "oracle_steps": oracle.found.steps,
            "oracle_k_usage": usage(oracle.found.schedule), **mine,
            "best_static": "no-spec" if k == 0 else f"fixed K={k}", "best_static_tokens_per_s": static,
            "nospec_priced_tokens_per_s": oracle.tokens_per_s(oracle.static_s[0]) if 0 in oracle.static_s else None,
            "fixed_priced_tokens_per_s": {k: oracle.tokens_per_s(s) for k, s in oracle.static_s.items() if k},
            "cost": cost.describe(), "seconds": round(oracle.seconds, 3)}
