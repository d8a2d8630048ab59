"""The ``goodput`` K policy, in three parts a reader can hold one at a time:

* :class:`StepCostModel` — what a step at K costs on this machine: the engine's measured verify
  time per K, then what repeated steps really take (verify and host time), the extra time of the
  first step after a change of K (the switch penalty), and the proposer's time per call.
* :class:`AcceptanceEstimator` — what proposals are worth: per-position acceptance from scored
  proposals (every proposal compared with the tokens its request went on to generate, so a
  proposal cut to a smaller K or not verified at all still counts), pooled, per request and
  after each way a request's last proposal fared; how often rows return a proposal, and how
  long runs of steps with proposals last.
* :class:`Goodput` — the decision rule: each step, the compiled K with the most expected tokens
  per second; whether to call the proposer at all; when to peek at it while skipping.

The policy asks the engine for two services in ``start``: measured step costs and proposal
scoring (:class:`spdflow.api.PolicyServices`).
"""
from __future__ import annotations

import math
from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import KPolicy, NoServices, PolicyServices


class GoodputConfig(BaseModel):
    """The ``with:`` block of ``k_policy: {uses: goodput}``: the estimators' tunables."""

    model_config = ConfigDict(extra="forbid")

    prior_accept: float = Field(0.6, gt=0.0, lt=1.0, description="Acceptance assumed at proposal position 1 before any is scored.")
    prior_weight: float = Field(4.0, gt=0.0, description="Pseudo-trials behind each prior (acceptance per position, run_on).")
    decay: float = Field(0.99, gt=0.0, le=1.0, description="Weight kept by older scored proposals per new one.")
    cost_ema: float = Field(0.05, gt=0.0, le=1.0, description="Step of the moving averages of verify, host and proposer time.")
    calibrate: bool = Field(True, description="Until a K has run two steps in a row, price it at its grid time x (the running K's learned time / its grid time): the grid's level was off by up to 10 % at batch 2 and 8, its ratios between Ks less.")
    follow: float = Field(0.0, ge=0.0, le=1.0, description="Share of a steady step's change of its K's verify and host time passed on to every other K's (0: a K that does not run keeps its last figure; 0.8 measured better at batch 1 and worse at batch 2-4).")
    penalty_ema: float = Field(0.1, gt=0.0, le=1.0, description="Step of the moving average of the switch penalty.")
    yield_ema: float = Field(0.1, gt=0.0, le=1.0, description="Step of the moving averages of the proposing share and run_on.")
    peek_share: float = Field(0.01, gt=0.0, le=1.0, description="Share of the run spent on peeks while proposing is skipped.")
    peek_min: int = Field(4, ge=1, description="Fewest steps between peeks.")
    peek_max: int = Field(256, ge=1, description="Most steps between peeks.")
    horizon: float = Field(8.0, gt=0.0, description="Tokens-left scale of the row weights exp(-(most - left) / horizon).")
    margin: float = Field(0.03, ge=0.0, description="How much better a K larger than the last step's must be than every K up to the last to be chosen (from K = 0: to leave K = 0).")
    evidence: int = Field(32, ge=1, description="Scored proposals (or 4x as many proposer calls) before proposing may be skipped.")
    row_weight: float = Field(2.0, ge=0.0, description="Pseudo-trials at the pooled acceptance behind each request's own scored proposals, per position (large: pooled only).")
    outcome_batch: int = Field(4, ge=0, description="From this many rows up (0: never), scale each row's acceptance by how proposals fared after one that fared like its request's last decided proposal (missed its first token, held in part, held whole); at batch 1 and 2 the replays measured it worse.")
    grades: bool = Field(True, description="Scale each row's acceptance by how proposals of its proposal's grade fared (a proposer that grades them, e.g. prompt lookup by matched n-gram length), after its request's last outcome where that is read.")
    budget_no_outcome: bool = Field(True, description="Price the proposer budget (whether to call the proposer, and how much) without the rows' last outcomes (outcome_batch): while the proposer is skipped no outcome is decided, so a row's last one is as old as the skipping, and a row that last missed kept it skipped.")
    reprice_every: int = Field(8, ge=1, description="Once the estimate is settled: steps between countings of the observed steps into the estimates, which also re-price the proposer budget (whether to propose, and how much) and forget choose_k's cached decisions.")


def any_proposes(share: float, rows: int) -> float:
    """The chance that at least one of ``rows`` rows gets a proposal, each with chance ``share``."""
    return 1.0 - (1.0 - share) ** rows


# ------------------------------------------------------------------------------ cost model


class StepCostModel:
    """Seconds of a step at each compiled K.

    Starts from the engine's measured verify time per K (1 s each when none was measured: only
    the ratios matter); the engine times each K after 4 warm-up runs, since with 1 its grid timed
    the slow steps after a change of shape and priced K = 0 too dear ("Issue 23, round 11"). A
    step at the same K as the last one moves that K's verify time towards what it took (moving
    average, step ``cost_ema``); the first step after a change instead teaches the switch
    penalty: its excess over the steady time (step ``penalty_ema``). Host time per K is a moving
    average too; shapes not run yet start from the first host time seen.

    With ``follow`` > 0 a K that does not run follows the one that does: a steady step that moves
    its K's verify (host) time by a factor f moves every other K's by ``1 + follow * (f - 1)``.
    All shapes slow down and speed up together on a shared machine, and with ``follow`` = 0 (the
    default) a K left during a slow spell keeps its slow figure: at batch 1, synthetic 0.6, K=4's
    step was priced at 1.34x K=2's (1.54x with the switch penalty) where fixed runs measured
    1.06-1.18x, and the rule stayed at K=2 for hundreds of steps. ``follow`` = 0.8 ended that
    stay and measured better at batch 1, but worse at batch 2-4 (benchmarks/k_policy_rounds.md, "Issue
    23, round 10"); it also keeps the timed grid's ratios between shapes for longer.

    With ``calibrate`` (on in goodput's defaults) a K that has not yet run a steady step is priced at its grid
    time scaled as the running K's learned time is to that K's grid time. The grid is timed in a
    burst before the run, and its level was off by up to 10 % at batch 2 and 8 where its ratios
    between shapes were within about 5 % (benchmarks/step_cost_grid.py). K = 0 rarely runs a
    steady step while proposals pay, so without this it kept a grid figure that was too cheap
    beside learned ones, and the rule ran K = 0 too often ("Issue 23, round 12").

    Verify times are kept non-decreasing in K: a shape with more positions never costs less.
    The timed grid is short and taken on a busy machine it can rate K = 7 below K = 2
    (benchmarks/k_policy_rounds.md, "The timed grid can invert the order of K"); a K that runs pulls the
    larger K up to its own time and the smaller K down to it, so a noisy start is not acted on.
    """

    def __init__(self, ks: Sequence[int], measured: dict[int, float] | None, cost_ema: float, penalty_ema: float,
                 follow: float = 0.0, calibrate: bool = False):
        self.cost_ema, self.penalty_ema, self.follow = cost_ema, penalty_ema, follow
        self.ks = sorted(ks)
        self.verify_s = {k: float(measured[k]) if measured else 1.0 for k in self.ks}
        for smaller, larger in zip(self.ks, self.ks[1:]):
            self.verify_s[larger] = max(self.verify_s[larger], self.verify_s[smaller])
        self.grid = dict(self.verify_s)
        #: Ks priced from the grid, scaled to the running K (``calibrate``), until they run steady
        self.unlearned = set(self.ks) if calibrate and measured else set()
        self.host_s: dict[int, float | None] = {k: None for k in ks}
        self.penalty_s = 0.0  # extra verify time of the first step after a change of K
        self.propose_s: float | None = None  # seconds per proposer call, once one was seen
        self.last_k: int | None = None  # K of the last step (the rule may set it before observe runs)
        self._observed_k: int | None = None  # K of the last step observed

    def step_cost(self, k: int) -> float:
        """Seconds of a step at K when K repeats: the steady verify time plus host time."""
        return self.verify_s[k] + (self.host_s[k] or 0.0)

    def detour_cost(self, k: int, back: float) -> float:
        """Seconds of a step at K taken by a step without proposals: a change of K costs the
        switch penalty, and once more with chance ``back`` for coming back."""
        cost = self.step_cost(k)
        if k == self.last_k or self.last_k is None:
            return cost
        return cost + (1.0 + back) * self.penalty_s

    def _calibrate(self, k: int) -> None:
        """K ran a steady step: it is learned, and each K not yet learned is priced at its grid
        time scaled as K's learned time is to K's grid time, within the learned Ks around it."""
        unlearned, verify, grid, ks = self.unlearned, self.verify_s, self.grid, self.ks
        unlearned.discard(k)
        scale = verify[k] / grid[k] if grid[k] > 0 else 1.0
        # The learned Ks' figures around each unlearned K: the highest below it, the lowest above
        floors, ceilings, high, low = {}, {}, None, None
        for j in ks:
            if j in unlearned:
                floors[j] = high
            elif high is None or verify[j] > high:
                high = verify[j]
        for j in reversed(ks):
            if j in unlearned:
                ceilings[j] = low
            elif low is None or verify[j] < low:
                low = verify[j]
        for other in unlearned:
            figure = grid[other] * scale
            floor, ceiling = floors[other], ceilings[other]
            floor = figure if floor is None else floor
            ceiling = figure if ceiling is None else ceiling
            verify[other] = min(max(figure, floor), max(ceiling, floor))

    def observe(self, k: int, verify_s: float, host_s: float, propose_s: float) -> None:
        """One step's times, in order; K becomes the last K."""
        a, follow = self.cost_ema, self.follow
        steady = k == self._observed_k
        if steady:
            verify = self.verify_s
            before = verify[k]
            verify[k] = mine = before + a * (verify_s - before)
            if follow:
                _carry(verify, k, before, follow)
            if self.unlearned:
                self._calibrate(k)
            for other in self.ks:  # keep the order of K (see the class docstring)
                if (verify[other] > mine) if other < k else (other > k and verify[other] < mine):
                    verify[other] = mine
        elif self._observed_k is not None:
            excess = verify_s - self.verify_s[k]
            self.penalty_s += self.penalty_ema * (excess - self.penalty_s)
        host = self.host_s
        if host[k] is None:
            for key in host:
                if host[key] is None:
                    host[key] = host_s
        before = host[k]
        host[k] += a * (host_s - before)
        if steady and follow:
            _carry(host, k, before, follow)
        self.last_k = self._observed_k = k
        if propose_s > 0:
            if self.propose_s is None:
                self.propose_s = propose_s
            self.propose_s += a * (propose_s - self.propose_s)


def _carry(figures: dict[int, float], k: int, before: float, follow: float) -> None:
    """Move every other K's figure by ``follow`` of the factor K's figure just moved by (from ``before``)."""
    if follow and before > 0:
        moved = 1.0 + follow * (figures[k] / before - 1.0)
        for other in figures:
            if other != k:
                figures[other] *= moved


# ------------------------------------------------------------------------------ acceptance estimator


class AcceptanceEstimator:
    """What proposals are worth, from what the engine scored.

    ``accept[j]`` is the chance that proposal position j holds given that 1..j-1 did, counted
    over recent scored proposals (older ones fading by ``decay`` per proposal); each position
    starts from ``prior_weight`` pseudo-trials at the estimate of the position before it (the
    first at ``prior_accept``). ``yield_rate`` is the share of rows that return a proposal when
    the proposer runs; ``follows`` counts, fading by ``1 - yield_ema``, steps with proposals
    whose next proposer call was seen, and those that had proposals again (for :meth:`run_on`).

    ``last[request]`` is how the request's last decided proposal fared (:data:`MISSED`,
    :data:`IN_PART`, :data:`WHOLE`), and ``after[o]`` counts the scored proposals decided after
    one that fared ``o`` (with ``by_outcome``; see :meth:`row_extras`).

    Counts are kept as histograms: ``tried[c]`` proposals were checked to exactly position c,
    ``held[m]`` held to exactly m; position j's tries and hits (:attr:`tries`, :attr:`hits`) are
    the sums from j up, taken when an estimate is priced. Fading is a unit: a new proposal
    counts ``unit``, which grows by ``1 / decay`` per proposal, so counting a step adds two
    numbers per table a proposal goes into and rescales nothing (once a run, rarely). Fading
    every count of every table per step was most of the policy's counting time at batch 8.
    """

    def __init__(self, max_k: int, config: GoodputConfig, by_outcome: bool = False):
        self.config = config
        self.by_outcome = by_outcome  # read each row's last outcome (see row_extras)
        # Index j is proposal position j (1-based); index 0 is unused.
        self.tried = [0.0] * (max_k + 1)  # faded, in units of ``unit``
        self.held = [0.0] * (max_k + 1)
        self.unit = 1.0  # what a proposal counted now adds to the faded counts
        self.yield_rate = 1.0
        self.calls = 0  # proposer calls seen
        self.follows = [0.0, 0.0]
        self._had_some = False  # the last step ran the proposer and some row proposed
        self._extra: list[float] | None = None
        self._rates: list[float] = []
        self.by_request: dict[int, tuple[list[int], list[int]]] = {}  # request -> (tried, held), not faded
        self._pairs: dict[tuple, list[float]] = {}  # (request, last outcome) -> extra, until an estimate changes
        self._after_ratios: list[list[float]] | None = None  # _after_rates, until an estimate changes
        self._own: dict[int | None, list[float]] = {}  # request -> its own rates, until an estimate changes
        self.last: dict[int, int] = {}  # request -> how its last decided proposal fared
        self.after = [([0.0] * (max_k + 1), [0.0] * (max_k + 1)) for _ in OUTCOMES]  # (tried, held) per outcome, faded
        #: (last outcome or None, grade) -> (tried, held), faded; with ``config.grades``
        self.graded: dict[tuple[int | None, int], tuple[list[float], list[float]]] = {}
        self._graded_ratios: dict[tuple[int | None, int], list[float]] = {}  # until an estimate changes

    @property
    def tries(self) -> list[float]:
        """Per position j (index 0 unused): the faded count of scored proposals checked to j."""
        return _from_each(self.tried, 1.0 / self.unit)

    @property
    def hits(self) -> list[float]:
        """Per position j (index 0 unused): the faded count of scored proposals that held to j."""
        return _from_each(self.held, 1.0 / self.unit)

    def expected_extra(self) -> list[float]:
        """``extra[n]``: expected accepted proposals of a row that proposes n tokens (cached)."""
        if self._extra is None:
            prior, weight = self.config.prior_accept, self.config.prior_weight
            rates, previous, tries, hits = [1.0], prior, self.tries, self.hits
            for j in range(1, len(tries)):
                previous = (hits[j] + weight * previous) / (tries[j] + weight)
                rates.append(previous)
            self._rates, self._extra = rates, _running_extra(rates)
            self._forget()
        return self._extra

    def _forget(self) -> None:
        """An estimate changed: drop what was derived from it."""
        self._pairs, self._after_ratios, self._own, self._graded_ratios = {}, None, {}, {}

    def row_extras(self, requests: Sequence[int | None],
                   grades: Sequence[int | None] | None = None, outcomes: bool = True) -> list[list[float]]:
        """``extra[n]`` of each row of a batch, from each request's own scored proposals.

        Per position, a request's rate is its own hits and tries behind ``row_weight``
        pseudo-trials at the pooled rate (a request with no scored proposal, or ``None``, gets
        the pooled estimate). Requests differ: over 16 code prompts the share of proposals whose
        first token held ranged 0.27-0.94 between requests, and in a static batch the slowest
        request sets the batch's length.

        With ``by_outcome`` (goodput's ``outcome_batch``), that rate is then scaled by the rate
        after the request's last outcome over the pooled rate (at most 0.995): prompt lookup
        copies in spells, and along a fixed K = 7 path through the code runs, a proposal's first
        token held 0.86 of the time after one that held whole and 0.25 after one that missed
        (benchmarks/k_policy_rounds.md, "Issue 23, round 15"). Each request's rates, and its extras after
        each outcome, are cached until an estimate changes.

        With ``grades`` (one per row, None where ungraded; goodput passes them with its ``grades``
        setting on), a graded row's rate is scaled instead by how proposals of its grade fared
        after that outcome (or at all, without ``by_outcome``), over the pooled rate. With
        ``outcomes`` False (goodput's proposer budget, ``budget_no_outcome``) no last outcome is read.
        """
        pooled_extra = self.expected_extra()  # (a new pooled estimate drops the cache)
        last = self.last if self.by_outcome and outcomes else {}
        if grades is None:
            grades = [None] * len(requests)
        extras, pairs = [], self._pairs
        for request, grade in zip(requests, grades):
            outcome = last.get(request)
            extra = pairs.get((request, outcome, grade))
            if extra is None:
                extra = pairs[(request, outcome, grade)] = self._extra_of(request, outcome, grade, pooled_extra)
            extras.append(extra)
        return extras

    def _extra_of(self, request: int | None, outcome: int | None, grade: int | None,
                  pooled_extra: list[float]) -> list[float]:
        """``extra[n]`` of a request after ``outcome`` with a proposal of ``grade`` (None, None:
        its own estimate alone)."""
        rates = self._own.get(request)
        if rates is None:
            seen = self.by_request.get(request) if request is not None else None
            rates = self._rates
            if seen is not None:
                pooled, weight, tries, hits = rates, self.config.row_weight, _from_each(seen[0]), _from_each(seen[1])
                rates = [1.0] + [(hits[j] + weight * pooled[j]) / (tries[j] + weight) for j in range(1, len(pooled))]
            self._own[request] = rates
        if grade is not None:
            after = self._graded_rates(outcome, grade)
        elif outcome is not None:
            after = self._after_rates()[outcome]
        else:
            return pooled_extra if rates is self._rates else _running_extra(rates)
        return _running_extra([1.0] + [min(0.995, rates[j] * after[j]) for j in range(1, len(rates))])

    def _graded_rates(self, outcome: int | None, grade: int) -> list[float]:
        """Per position: the rate of proposals of ``grade`` after ``outcome`` over the pooled
        rate, behind ``prior_weight`` pseudo-trials at the rate after ``outcome`` (the pooled
        rate when None); cached."""
        key = (outcome, grade)
        ratios = self._graded_ratios.get(key)
        if ratios is None:
            pooled = self._rates
            base = pooled if outcome is None else [p * r for p, r in zip(pooled, self._after_rates()[outcome])]
            ratios = self._graded_ratios[key] = self._over_pooled(self.graded.get(key), base)
        return ratios

    def _over_pooled(self, table: tuple[list[float], list[float]] | None, base: list[float]) -> list[float]:
        """Per position: the rate of a faded (tried, held) ``table`` behind ``prior_weight``
        pseudo-trials at ``base`` (``base`` itself without a table), over the pooled rate."""
        pooled = self._rates
        if table is not None:
            weight, scale = self.config.prior_weight, 1.0 / self.unit
            tries, hits = _from_each(table[0], scale), _from_each(table[1], scale)
            base = [1.0] + [(hits[j] + weight * base[j]) / (tries[j] + weight) for j in range(1, len(pooled))]
        return [1.0] + [base[j] / max(pooled[j], 1e-6) for j in range(1, len(pooled))]

    def _after_rates(self) -> list[list[float]]:
        """Per outcome, per position: the rate after that outcome over the pooled rate (each
        behind ``prior_weight`` pseudo-trials at the pooled rate); cached."""
        if self._after_ratios is None:
            self._after_ratios = [self._over_pooled(table, self._rates) for table in self.after]
        return self._after_ratios

    def note_outcomes(self, requests: Sequence[int], scored: Sequence[tuple[int, int]]) -> list[int | None]:
        """Each scored proposal's request's last outcome before it; then the new last outcomes."""
        before, last = [], self.last
        for request, (checked, matched) in zip(requests, scored):
            before.append(last.get(request))
            last[request] = WHOLE if matched == checked else (IN_PART if matched else MISSED)
        return before

    def count(self, scored: Sequence[tuple[int, int]], requests: Sequence[int] = (),
              before: Sequence[int | None] = (), grades: Sequence[int | None] = ()) -> None:
        """One step's decided proposals, (checked, matched) each: positions 1..checked were tried,
        1..matched held. Each is counted into the pooled counts (older ones fading by ``decay``
        per proposal), into its request's own (``requests[i]`` made ``scored[i]``) and, given
        ``before`` (:meth:`note_outcomes`), under the outcome its request had before it; given
        ``grades`` (with the config's ``grades``), under its grade and that outcome (both fading
        as the pooled counts do)."""
        if not scored:
            return
        fade = self.config.decay ** len(scored)
        unit = self.unit / fade if fade > 0.0 else math.inf  # the older counts fade against it
        if unit > 1e6:  # bring the faded counts back to a unit of 1 (about every 1400 proposals)
            tables = (*self.after, *self.graded.values())
            for counts in (self.tried, self.held, *(c for table in tables for c in table)):
                counts[:] = [n / unit for n in counts]
            unit = 1.0
        self.unit = unit
        tried, held, after, by_request, size = self.tried, self.held, self.after, self.by_request, len(self.tried)
        graded = self.config.grades and len(grades) == len(scored)
        for i, (checked, matched) in enumerate(scored):
            tried[checked] += unit
            held[matched] += unit
            if i < len(requests):
                seen = by_request.get(requests[i])
                if seen is None:
                    seen = by_request[requests[i]] = ([0] * size, [0] * size)
                seen[0][checked] += 1
                seen[1][matched] += 1
            last = before[i] if i < len(before) else None
            if last is not None:
                table = after[last]
                table[0][checked] += unit
                table[1][matched] += unit
            if graded and grades[i] is not None:
                table = self.graded.get((last, grades[i]))
                if table is None:
                    table = self.graded[(last, grades[i])] = ([0.0] * size, [0.0] * size)
                table[0][checked] += unit
                table[1][matched] += unit
        self._extra = None
        self._forget()

    def keep_requests(self, requests: Sequence[int]) -> None:
        """Forget the requests that left the batch."""
        for request in [r for r in self.by_request if r not in requests]:
            del self.by_request[request]
        for request in [r for r in self.last if r not in requests]:
            del self.last[request]

    def settled(self) -> bool:
        """Enough evidence to act on: ``evidence`` scored proposals or 4x as many proposer calls
        (a proposer that rarely returns one is judged by its calls)."""
        return sum(self.tried[1:]) >= self.config.evidence * self.unit or self.calls >= 4 * self.config.evidence

    def run_on(self, rows: int) -> float:
        """The chance that a step with proposals is followed by another: seen counts, and a
        prior of ``prior_weight`` steps at what independent steps would give."""
        alone = any_proposes(self.yield_rate, max(rows, 1))
        seen, again = self.follows
        return (again + self.config.prior_weight * alone) / (seen + self.config.prior_weight)

    def observe_call(self, offered: float) -> None:
        """The proposer ran; ``offered`` is the share of rows that got a proposal."""
        self.calls += 1
        self.yield_rate += self.config.yield_ema * (offered - self.yield_rate)
        some = offered > 0
        if self._had_some:
            keep = 1.0 - self.config.yield_ema
            self.follows = [self.follows[0] * keep + 1.0, self.follows[1] * keep + some]
        self._had_some = some

    def observe_no_call(self) -> None:
        """A step that skipped the proposer: it says nothing about runs, and breaks one."""
        self._had_some = False

#: how a decided proposal fared: its first token missed, it held in part, it held whole
MISSED, IN_PART, WHOLE = OUTCOMES = (0, 1, 2)


def _from_each(counts: Sequence[float], scale: float = 1.0) -> list[float]:
    """Per position j (index 0 unused): ``scale`` x the counts at j and beyond."""
    out, total = [0.0] * len(counts), 0.0
    for j in range(len(counts) - 1, 0, -1):
        total += counts[j]
        out[j] = total * scale
    return out


def _running_extra(rates: Sequence[float]) -> list[float]:
    """``extra[n]`` from conditional acceptance per position (index 0 unused)."""
    extra, run = [0.0], 1.0
    for rate in rates[1:]:
        run *= rate
        extra.append(extra[-1] + run)
    return extra


# ------------------------------------------------------------------------------ decision rule


class Goodput(KPolicy):
    """Cost-aware varK: each step, the compiled K with the most expected tokens per second.

    A row with n proposals is worth ``1 + extra[min(n, K)]`` tokens (:class:`AcceptanceEstimator`);
    a step costs :meth:`StepCostModel.step_cost`. The rule picks ``argmax_K tokens(K) / cost(K)``,
    ties to the smaller K, truncating proposals longer than K. Seven refinements, each tested in
    tests/plugins/test_k_policy.py and each kept for a measurement in benchmarks/k_policy_rounds.md
    or benchmarks/README.md (the section named in brackets):

    * Requests apart: each row is priced at its own request's acceptance
      (:meth:`AcceptanceEstimator.row_extras`), except that the batch-1 proposer budget reads the
      pooled estimate. [K policy tables, "Issue 23, round 2": the pooled estimate alone missed
      the line by 6-13 % at batch 8 on prompt lookup.]
    * Spells (from ``outcome_batch`` rows up): a row's rate is scaled by how proposals fared
      after one that fared like its request's last decided proposal; the outcome is noted at the
      step it is decided, not at the next count. [Priced replays, "Issue 23, round 15": the worst
      cell went from -3.7 % to -2.0 % (tuned-on prompts) and from -2.1 % to -0.8 % (held out);
      read at batch 1 and 2 too, it did worse there on both.] The proposer budget does not read
      it (``budget_no_outcome``): while the proposer is skipped no outcome is decided, and rows
      that last missed kept it skipped. [Live A/B, "Issue 23, round 25": code at batch 4 skipped
      the proposer on 107-204 of some 300 steps; without the outcomes in the budget, the priced
      regret of batch 4 and 8 on three prompt-lookup workloads went from -1.75 % to +1.31 %.]
    * Grades (``grades``): when the proposer grades its proposals (:attr:`spdflow.api.Proposal.grade`;
      prompt lookup: the length of the n-gram it matched), a graded row's rate is scaled instead
      by how proposals of its grade fared after that outcome (at batch 1 and 2: at all), seen
      before the step's K is chosen (:meth:`see_grades`). [Priced replays, "Issue 23, round 18":
      on code at fixed K = 7, proposals from a 1-token match held 1.35 tokens, from a 3-token
      match 4.91; mean regret +2.25 -> +2.63 % (tuned on), +2.70 -> +2.86 % (held out); scaling
      the pooled rate instead of the request's own, or a request's own rate per grade, did worse.]
    * Switches: leaving the cheapest K for a step with proposals pays the switch penalty to
      leave and again to come back, shared over the steps a run of proposals is expected to
      last (``1 / (1 - run_on)``); a change between two speculating shapes pays it once; a step
      without proposals stays at its K or takes the smallest (:meth:`StepCostModel.detour_cost`),
      and takes the smallest while the proposer is skipped. [Switching shapes costs a step's
      worth of time; "Issue 23, round 2".]
    * Stepping up: a K larger than the last step's must beat every K up to the last by
      ``margin`` (stepping down or staying needs none): the estimates are noisy and a larger
      shape surely costs more. [From K = 0 only: "Issue 23, round 2"; every step up:
      "Issue 23, round 4", the close calls for K = 7 at batch 8.]
    * Static batches: when no request waits for a slot a batch ends with its last row, so a
      row's tokens weigh ``exp(-(most - left) / horizon)``. [What limits the misses, "Static
      batches end with idle rows": 0.82x no-spec against fixed's 0.64x at batch 8.]
    * Skipping the proposer: before it runs, ``propose_budget`` asks whether full-length
      proposals from the rows that usually propose, paying the proposer too, beat K = 0; once
      the estimate is settled (``evidence``), if not, the proposer is skipped, except for a
      peek every ``peek_every`` steps (about ``peek_share`` of the run) that keeps the estimate
      current. [The draft-model table: varK within 2 % of no-spec where fixed K loses 44-46 %;
      skipping waits for ``evidence``: "a bad start could trap it in skipping"; peek cost:
      "Policy and proposer cost at sub-millisecond steps".]

    Its own time: once the estimate is settled, observed steps are counted into the estimates every
    ``reprice_every`` steps, the budget is priced again at the next step (and at every peek), and
    where rows are not weighted (batch 1, or requests waiting) ``choose_k`` reuses a decision for
    the same proposals, last K and requests until the next count; while the proposer is skipped, a
    step between peeks reads nothing and only counts toward the next peek. At 1 ms steps (batch 1,
    code) the policy took 63 us a step in a generation when it did all of it every step (3-4x what
    it takes driven alone: caches are cold after each verify run), and 31-36 us so;
    smallest_covering takes 7-8. On a slower machine in round 13 it took 57 us a step at batch 1
    and 137 us at batch 8 (smallest_covering 16 and 25, with the timing's own cost in every
    figure), after its pricing loops were rewritten with the same decisions (66 and 168 before).
    With every step held at K = 2 (benchmarks/policy_time.py --pin), its work took 227-246 us a
    batch-8 step and cost the run 2.1-2.4 % against fixed K = 2 (smallest_covering 0.5-2.0 %).
    Counting into histograms with a fading unit, and no decision cache where row weights change
    every step, then took it from 141-147 to 121-123 us on a quieter machine (same decisions).
    ["Issue 23, round 3"; the skipping steps: "Issue 23, round 6"; "Issue 23, round 13"; "Issue 23,
    rounds 16 and 17".]

    ``margin``, ``evidence`` and ``row_weight`` were chosen by replaying recorded runs
    (``spdflow whatif --oracle``) over the tuned-on workloads ("Issue 23, round 2"); ``decay``,
    ``cost_ema``, ``penalty_ema`` and ``prior_weight`` were replayed at half and twice their
    defaults and each did worse ("Issue 23, round 5"); ``follow`` = 0.8 against 0 ran in
    benchmarks/k_policy_sim.py (recorded machine drift), two live A/Bs and the round-10 tables,
    and stays off ("Issue 23, round 10"); ``calibrate`` was turned on by a live A/B and its
    replicate, each with its rule written before it ran ("Issue 23, round 12"); the other
    tunables (``prior_accept``, ``yield_ema``, peek bounds) were not swept. All are ``with:``
    fields so that a recipe can.
    """

    name = "goodput"

    def __init__(self, config: "GoodputConfig | None" = None):
        self.config = config or GoodputConfig()
        self._reset([0], 1, None)

    def start(self, compiled_ks, rows, services: PolicyServices | None = None):
        services = services or NoServices()
        services.score_proposals()
        self._reset(compiled_ks, rows, services.step_costs())

    def _reset(self, compiled_ks, rows: int, measured: dict[int, float] | None) -> None:
        config = self.config
        self.ks = sorted(set(compiled_ks))
        self.rows = rows
        self.costs = StepCostModel(self.ks, measured, config.cost_ema, config.penalty_ema, config.follow,
                                   config.calibrate)
        self.acceptance = AcceptanceEstimator(self.ks[-1], config, 0 < config.outcome_batch <= rows)
        self._steps = 0
        self._cheapest: int | None = None  # cached cheapest K for steps without proposals
        self.skipping = False
        self.since_peek = 0
        self.peek_every = config.peek_min
        self.left: tuple[int, ...] = ()  # tokens left per row, from the last propose_budget
        self.requests: tuple[int, ...] = ()  # the request on each row, from the last propose_budget
        self.waiting = 0
        self.weights: list[float] | None = None
        self.grades: tuple[int | None, ...] = ()  # each row's proposal grade, from the last see_grades
        self.offered = 0.0  # share of rows with a proposal at the last choose_k
        self._budget_k: int | None = None  # the last priced proposer budget (0: skip)
        self._decided: dict[tuple, int] = {}  # choose_k's decisions since the estimates last changed
        self._pending: list = []  # (outcome, offered) of steps observed but not yet counted
        self._settled = False  # the estimates have enough evidence to act on (as of the last count)

    # -- the rule -------------------------------------------------------------------------------

    def run_on(self) -> float:
        return self.acceptance.run_on(len(self.left))

    def rates(self, proposal_counts: Sequence[int], extra_propose_s: float = 0.0,
              weights: Sequence[float] | None = None, share: float = 1.0, budget: bool = False,
              grades: Sequence[int | None] | None = None) -> dict[int, float]:
        """Expected (weighted) tokens per second of each compiled K for rows proposing these counts.

        ``share`` < 1 prices a step before the proposer has run: each row gets its proposal
        with chance ``share``, and when no row gets one the step runs at the cheapest K.
        ``budget`` marks the proposer budget's pricing (it reads the pooled estimate at batch 1);
        ``grades`` are the rows' proposal grades (:meth:`see_grades`), when known.
        Plain Python on purpose: it runs for a handful of rows and K values.
        """
        # Each row at its request's own estimate; except when pricing the proposer budget at
        # batch 1, where a request's own record early on is a few proposals and skipping the
        # proposer on it would also stop the evidence that could correct it.
        own = len(self.requests) == len(proposal_counts) and not (budget and self.rows == 1)
        extras = self.acceptance.row_extras(self.requests if own else [None] * len(proposal_counts), grades,
                                            not (budget and self.config.budget_no_outcome))
        if weights is None or len(weights) != len(proposal_counts):
            weights = [1.0] * len(proposal_counts)
        base = sum(weights)
        model, ks = self.costs, self.ks
        costs = [model.step_cost(k) for k in ks]
        low_cost = min(costs)
        low = ks[costs.index(low_cost)]  # the first (smallest) K of the lowest cost
        some = any_proposes(share, len(proposal_counts))
        last = model.last_k
        # What changing shape adds to a step at each K (none for the cheapest K)
        if last == low:
            # Leaving the cheapest K costs the switch penalty now and again when proposals run
            # out; each step of the run they are expected to last carries its share of both.
            add, keep = 2.0 * (1.0 - self.run_on()) * model.penalty_s, low
        elif last in ks and share >= 1.0:
            # From one speculating shape to another: the penalty once (choose_k, and a budget
            # priced for rows that always propose).
            add, keep = max(model.penalty_s, 0.0), last
        else:
            add, keep = 0.0, low
        rows = [(w, n, extra) for w, n, extra in zip(weights, proposal_counts, extras) if n]
        out = {}
        for k, cost in zip(ks, costs):
            # (the extra of a row proposing n tokens at K is extra[min(n, K)])
            tokens = base + share * sum([w * extra[k if k < n else n] for w, n, extra in rows])
            if k != low:
                if k != keep:
                    cost += add
                cost = some * cost + (1.0 - some) * low_cost + extra_propose_s
            out[k] = tokens / (cost if cost > 1e-9 else 1e-9)
        return out

    def row_weights(self) -> list[float] | None:
        """How much each row's tokens count this step (None: all alike); see the class docstring."""
        if self.weights is None and not self.waiting and len(self.left) > 1:
            most = max(self.left)
            if most > 0:
                self.weights = [math.exp((n - most) / self.config.horizon) for n in self.left]
        return self.weights

    def best(self, rates: dict[int, float]) -> int:
        """The K of the highest rate (ties to the smaller K); a K above the last one (the smallest
        before any step) must beat every K up to it by ``margin``."""
        ks = sorted(rates)
        last = self.costs.last_k if self.costs.last_k in rates else ks[0]
        floor = max(rates[k] for k in ks if k <= last) * (1.0 + self.config.margin)
        best, top = ks[0], rates[ks[0]]
        for k in ks[1:]:
            rate = rates[k]
            if rate > top and (k <= last or rate > floor):
                best, top = k, rate
        return best

    # -- the KPolicy protocol -----------------------------------------------------------------

    def propose_budget(self, k_max, step):
        self.since_peek += 1
        if self.skipping and self.since_peek < self.peek_every:
            # Skipping until the next peek: nothing here is read before then (the rows' tokens
            # left and requests are taken at the peek), so the step costs a counter.
            return 0
        self.left = step.tokens_left
        if step.requests != self.requests:
            self.acceptance.keep_requests(step.requests)
        self.requests = step.requests
        self.weights = None
        self.waiting = step.waiting
        if 0 not in self.ks:
            return k_max
        peek = self.since_peek >= self.peek_every
        if peek:
            self.since_peek = 0
        if not self._settled:
            self.skipping = False
            return k_max
        # What full-length proposals could bring from the rows that usually propose, paying
        # the proposer as well; priced again after each count of the observed steps and at every
        # peek (the estimates it reads move slowly, and pricing is most of the policy's time).
        if peek or self._budget_k is None:
            if peek:
                self.count_pending()
            full = [self.ks[-1]] * len(self.left)
            self._budget_k = self.best(self.rates(full, self.costs.propose_s or 0.0, self.row_weights(),
                                                  share=self.acceptance.yield_rate, budget=True))
        self.skipping = self._budget_k == 0
        return k_max if peek else min(k_max, self._budget_k)

    def choose_k(self, proposal_counts, compiled_ks):
        if compiled_ks != self.ks:
            ks = sorted(set(compiled_ks))
            if not ks:
                raise ValueError("no compiled K to choose from")
            if ks != self.ks:
                self._reset(ks, max(self.rows, len(proposal_counts)), None)
        if not any(proposal_counts):  # every K returns one token per row: the cheapest wins
            self.offered = 0.0
            if self.skipping:  # no proposal before the next peek: no reason to hold a larger shape
                return self.ks[0]
            if self._cheapest is None:
                back = any_proposes(self.acceptance.yield_rate, max(len(self.left), 1))
                # stay where a round trip would cost more, else the smallest K: never a third K,
                # which only noisy step timings could rate below the smallest (benchmarks/README.md,
                # "Proposals rare": K=4 on every step of a run where nothing was proposed)
                stay = [self.costs.last_k] if self.costs.last_k in self.ks else []
                self._cheapest = min([self.ks[0], *stay], key=lambda k: (self.costs.detour_cost(k, back), k))
            return self._cheapest
        self.offered = (len(proposal_counts) - proposal_counts.count(0)) / len(proposal_counts)
        weights = self.row_weights()
        grades = self.row_grades(len(proposal_counts))
        if weights is not None:  # a static batch's row weights move every step: nothing to reuse
            return self.best(self.rates(proposal_counts, weights=weights, grades=grades))
        key = (tuple(proposal_counts), self.costs.last_k, self.requests,
               tuple(self.acceptance.last.get(r) for r in self.requests) if self.acceptance.by_outcome else None,
               grades)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decided[key] = self.best(self.rates(proposal_counts, weights=weights, grades=grades))
        return decided

    def see_grades(self, grades):
        if self.config.grades:
            self.grades = tuple(grades)  # read by the choose_k that follows

    def row_grades(self, rows: int) -> tuple[int | None, ...] | None:
        """The rows' proposal grades from the last :meth:`see_grades` (None: not read, or not
        one per row)."""
        return self.grades if len(self.grades) == rows else None

    def observe(self, outcome):
        k = outcome.k
        if k != self.costs.last_k or self._steps % 16 == 0:
            self._cheapest = None  # the cheapest K depends on the last K and drifts slowly
        self._steps += 1
        self.costs.last_k = k
        # The estimates are read only when something is priced, so a step is counted then, or
        # after ``reprice_every`` steps: one loop over a few steps instead of a call per step
        # (at 1 ms steps, counting every step took ~20 us of each, 4x its cost in a tight loop).
        # a request's last outcome is read at the next step, so it is noted now
        before = self.acceptance.note_outcomes(outcome.scored_requests, outcome.scored) if self.acceptance.by_outcome else ()
        self._pending.append((outcome, self.offered, before))
        if len(self._pending) >= self.config.reprice_every or not self._settled:
            self.count_pending()

    def count_pending(self) -> None:
        """Count the observed steps into the estimates, in order; forget decisions made before."""
        if not self._pending:
            return
        costs, acceptance, config = self.costs, self.acceptance, self.config
        for outcome, offered, before in self._pending:
            costs.observe(outcome.k, outcome.verify_s, outcome.host_s, outcome.propose_s)
            if outcome.propose_s > 0:
                acceptance.observe_call(offered)
            else:
                acceptance.observe_no_call()
            acceptance.count(outcome.scored, outcome.scored_requests, before, outcome.scored_grades)
        self._pending.clear()
        self._decided.clear()
        self._budget_k = None  # priced again at the next step
        self._settled = acceptance.settled()
        if costs.propose_s is not None:
            # A peek costs the proposer and about a step's host work (scoring, estimates).
            low, host = self.ks[0], costs.host_s
            peek_s = costs.propose_s + (host[low] or 0.0)
            every = peek_s / max(config.peek_share * (costs.verify_s[low] + (host[low] or 0.0)), 1e-9)
            self.peek_every = int(min(max(every, config.peek_min), config.peek_max))
