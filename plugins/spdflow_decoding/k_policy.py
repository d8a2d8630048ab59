"""K policies: pick the compiled decode shape (K) of a step from the batch's proposal counts.

The compiled K-list is given sorted and deduplicated. ``smallest_covering`` is the varK policy
of DESIGN §4 (QEfficient PR #984's ``_select_k``, except that an empty batch gets the smallest K:
nothing to verify should cost the cheapest shape, not the largest).
"""
from __future__ import annotations

import math
from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import KPolicy


class GoodputConfig(BaseModel):
    """The ``with:`` block of ``k_policy: {uses: goodput}``: the estimators' tunables."""

    model_config = ConfigDict(extra="forbid")

    prior_accept: float = Field(0.6, gt=0.0, lt=1.0, description="Acceptance assumed at proposal position 1 before any is scored.")
    prior_weight: float = Field(4.0, gt=0.0, description="Pseudo-trials behind each prior (acceptance per position, run_on).")
    decay: float = Field(0.99, gt=0.0, le=1.0, description="Weight kept by older scored proposals per new one.")
    cost_ema: float = Field(0.05, gt=0.0, le=1.0, description="Step of the moving averages of verify, host and proposer time.")
    penalty_ema: float = Field(0.1, gt=0.0, le=1.0, description="Step of the moving average of the switch penalty.")
    yield_ema: float = Field(0.1, gt=0.0, le=1.0, description="Step of the moving averages of the proposing share and run_on.")
    peek_share: float = Field(0.01, gt=0.0, le=1.0, description="Share of the run spent on peeks while proposing is skipped.")
    peek_min: int = Field(4, ge=1, description="Fewest steps between peeks.")
    peek_max: int = Field(256, ge=1, description="Most steps between peeks.")
    horizon: float = Field(8.0, gt=0.0, description="Tokens-left scale of the row weights exp(-(most - left) / horizon).")
    margin: float = Field(0.1, ge=0.0, description="How much better than K = 0 a K must be to leave K = 0.")
    evidence: int = Field(8, ge=1, description="Scored proposals (or 4x as many proposer calls) before proposing may be skipped.")


def smallest_covering_k(proposal_counts: Sequence[int], compiled_ks: Sequence[int]) -> int:
    """The smallest compiled K >= the largest proposal count; the largest K when none covers.

    No proposals (or an empty batch) need K = 0, so they get the smallest compiled K.
    """
    ks = sorted(compiled_ks)
    if not ks:
        raise ValueError("no compiled K to choose from")
    need = max(proposal_counts, default=0)
    for k in ks:
        if k >= need:
            return k
    return ks[-1]


def any_proposes(share: float, rows: int) -> float:
    """The chance that at least one of ``rows`` rows gets a proposal, each with chance ``share``."""
    return 1.0 - (1.0 - share) ** rows


class SmallestCovering(KPolicy):
    """varK: the smallest compiled K that verifies every proposal of the step."""

    name = "smallest_covering"

    def choose_k(self, proposal_counts, compiled_ks):
        return smallest_covering_k(proposal_counts, compiled_ks)


class FixedK(KPolicy):
    """Always the largest compiled K, as a fixed-K SpD system would run."""

    name = "fixed"

    def required_ks(self, compiled_ks):
        return [max(compiled_ks)] if compiled_ks else []

    def choose_k(self, proposal_counts, compiled_ks):
        if not compiled_ks:
            raise ValueError("no compiled K to choose from")
        return max(compiled_ks)


class NoSpec(KPolicy):
    """Always K = 0: the no-spec baseline on the same compiled program."""

    name = "nospec"

    def required_ks(self, compiled_ks):
        return [0]

    def choose_k(self, proposal_counts, compiled_ks):
        if 0 not in compiled_ks:
            raise ValueError(
                f"k_policy 'nospec' needs K = 0 in num_speculative_tokens, compiled: {sorted(compiled_ks)}"
            )
        return 0


class Goodput(KPolicy):
    """Cost-aware varK: each step, the compiled K with the most expected tokens per second.

    What a step at K returns is estimated from per-position acceptance: ``accept[j]`` is the
    chance that proposal j is accepted given that proposals 1..j-1 were (counted over recent
    proposals, older ones fading by ``decay`` per proposal). The counts come from the engine's
    scoring (``wants_scores``): every proposal is compared with the tokens its request goes on
    to generate, so a proposal cut to a smaller K, or not verified at all (K = 0), still shows
    how far it would have held. Each position starts from a prior of ``prior_weight``
    pseudo-trials at the estimate of the position before it (the first at ``prior_accept``). A
    row with n proposals is then worth ``1 + sum_{j <= min(n, K)} prod_{i <= j} accept[i]``
    tokens. What it costs is the verify time of K plus the host time of a step at K: the engine
    times each compiled shape once per session (``step_costs``), and the estimates then follow
    what repeated steps really take. Changing K costs extra on the first step after the change
    (on the CPU backend each shape is its own session with its own packed weights and buffers,
    so the first run after a switch starts from colder caches). That penalty is learned from
    every change. A step without any proposal stays at the last K or takes a cheaper K (one
    penalty, and another for returning if proposals come back). Leaving the cheapest K for a
    step with proposals pays the penalty to leave and again to come back, shared over the
    steps a run of proposals is expected to last: ``1 / (1 - run_on())``, where ``run_on()``
    is the chance that a step with proposals is followed by another (counted over recent
    steps, starting from what independent steps would give: the chance any row proposes).
    Changes among the larger K use the steady costs. The policy
    picks ``argmax_K tokens(K) / cost(K)``, ties going to the smaller K, and truncates
    proposals longer than K. Leaving K = 0 to speculate must win by ``margin``: estimates are
    noisy, and a near tie is not worth a switch.

    When no request waits for a slot, a batch finishes with its last row, so a row's tokens
    are weighted by ``exp(-(most - left) / horizon)``: the rows with the most tokens left
    decide, and rows a few steps ahead (which would sit idle at the end anyway) count little.

    Before the proposer runs, ``propose_budget`` asks: would full-length proposals, from the
    share of rows that recently returned one, beat K = 0, counting the proposer's own time? If
    not, steps skip the proposer, but only once the estimate rests on ``evidence`` scored
    proposals (or ``4 * evidence`` proposer calls, for proposers that rarely return one): the
    prior alone must not stop the proposer, since while it is skipped only peeks teach. Every
    ``peek_every`` steps (skipping or not) the proposer
    drafts the full K: these peeks keep the acceptance estimate current at a cost of about
    ``peek_share`` of the run (the interval is the proposer's time plus a step's host time,
    over that share of a K = 0 step, within ``peek_min..peek_max``). So where proposals rarely land, the run costs about
    what no-spec costs.
    """

    name = "goodput"
    wants_step_costs = True
    wants_scores = True

    def __init__(self, config: "GoodputConfig | None" = None):
        self.config = config or GoodputConfig()
        self.start([0], 1, None)

    def start(self, compiled_ks, rows, step_costs):
        self.ks = sorted(set(compiled_ks))
        self.rows = rows
        size = self.ks[-1] + 1
        # Index j is proposal position j (1-based); index 0 is unused.
        self.tries = [0.0] * size
        self.hits = [0.0] * size
        self.verify_s = {k: float(step_costs[k]) if step_costs else 1.0 for k in self.ks}
        self.penalty_s = 0.0  # extra verify time of the first step after a change of K
        self.host_s: dict[int, float | None] = {k: None for k in self.ks}
        self.last_k: int | None = None
        self._steps = 0
        self._cheapest: int | None = None  # cached cheapest K for steps without proposals
        self.propose_s: float | None = None  # seconds per proposer call, once one was seen
        self.yield_rate = 1.0  # share of rows that return a proposal when the proposer runs
        self.skipping = False
        self.calls = 0  # proposer calls seen
        self.since_peek = 0
        self.peek_every = self.config.peek_min
        self.left: tuple[int, ...] = ()  # tokens left per row, from the last propose_budget
        self.waiting = 0
        self.weights: list[float] | None = None
        self.offered = 0.0  # share of rows with a proposal at the last choose_k
        # Fading counts: steps with a proposal whose next step was seen, and those that proposed again.
        self.follows = [0.0, 0.0]
        self._had_some = False  # the last step ran the proposer and some row proposed
        self._extra: list[float] | None = None

    # -- estimates ----------------------------------------------------------------------------

    def expected_extra(self) -> list[float]:
        """``extra[n]``: expected accepted proposals of a row that proposes n tokens (cached)."""
        if self._extra is None:
            extra, run, previous = [0.0], 1.0, self.config.prior_accept
            for j in range(1, len(self.tries)):
                previous = (self.hits[j] + self.config.prior_weight * previous) / (self.tries[j] + self.config.prior_weight)
                run *= previous
                extra.append(extra[-1] + run)
            self._extra = extra
        return self._extra

    def rates(self, proposal_counts: Sequence[int], extra_propose_s: float = 0.0,
              weights: Sequence[float] | None = None, share: float = 1.0) -> dict[int, float]:
        """Expected (weighted) tokens per second of each compiled K for rows proposing these counts.

        ``share`` < 1 prices a step before the proposer has run: each row gets its proposal
        with chance ``share``, and when no row gets one the step runs at the cheapest K. Plain
        Python on purpose: it runs every step, for a handful of rows and K values.
        """
        extra = self.expected_extra()
        if weights is None or len(weights) != len(proposal_counts):
            weights = [1.0] * len(proposal_counts)
        base = sum(weights)
        costs = {k: self.step_cost(k) for k in self.ks}
        low = min(costs, key=lambda k: (costs[k], k))
        low_cost = costs[low]
        some = any_proposes(share, len(proposal_counts))
        if self.last_k == low:
            # Leaving the cheapest K costs the switch penalty now and again when proposals run
            # out; each step of the run they are expected to last carries its share of both.
            for k in self.ks:
                if k != low:
                    costs[k] += 2.0 * (1.0 - self.run_on()) * self.penalty_s
        out = {}
        for k in self.ks:
            tokens = base + share * sum(w * extra[min(n, k)] for w, n in zip(weights, proposal_counts) if n)
            cost = costs[k]
            if k != low:
                cost = some * cost + (1.0 - some) * low_cost + extra_propose_s
            out[k] = tokens / max(cost, 1e-9)
        return out

    def run_on(self) -> float:
        """The chance that a step with proposals is followed by another: seen counts, and a
        prior of ``prior_weight`` steps at what independent steps would give."""
        alone = any_proposes(self.yield_rate, max(len(self.left), 1))
        seen, again = self.follows
        return (again + self.config.prior_weight * alone) / (seen + self.config.prior_weight)

    def row_weights(self) -> list[float] | None:
        """How much each row's tokens count this step (None: all alike); see the class docstring."""
        if self.weights is None and not self.waiting and self.left:
            most = max(self.left)
            if most > 0:
                self.weights = [math.exp((n - most) / self.config.horizon) for n in self.left]
        return self.weights

    def step_cost(self, k: int) -> float:
        """Seconds of a step at K when K repeats: the steady verify time plus host time."""
        return self.verify_s[k] + (self.host_s[k] or 0.0)

    def detour_cost(self, k: int) -> float:
        """Seconds of a step at K taken by a step without proposals.

        Changing K costs the switch penalty (the extra time of the first step after a change,
        learned from every change seen), and once more for coming back if the next step has
        proposals again (as likely as some row getting one).
        """
        cost = self.step_cost(k)
        if k == self.last_k or self.last_k is None:
            return cost
        back = any_proposes(self.yield_rate, max(len(self.left), 1))
        return cost + (1.0 + back) * self.penalty_s

    def best(self, rates: dict[int, float]) -> int:
        """The K of the highest rate (ties to the smaller K); leaving K = 0 must win by ``margin``."""
        if 0 in rates and self.last_k in (0, None):
            floor = rates[0] * (1.0 + self.config.margin)
            rates = {k: r for k, r in rates.items() if k == 0 or r > floor}
        return max(rates, key=lambda k: (rates[k], -k))

    # -- the KPolicy protocol -----------------------------------------------------------------

    def propose_budget(self, k_max, step):
        self.left = step.tokens_left
        self.weights = None
        self.waiting = step.waiting
        if 0 not in self.ks:
            return k_max
        self.since_peek += 1
        peek = self.since_peek >= self.peek_every
        if peek:
            self.since_peek = 0
        elif self.skipping:
            return 0
        # What full-length proposals could bring from the rows that usually propose, paying
        # the proposer as well.
        full = [self.ks[-1]] * len(self.left)
        best = self.best(self.rates(full, self.propose_s or 0.0, self.row_weights(), share=self.yield_rate))
        settled = self.tries[1] >= self.config.evidence or self.calls >= 4 * self.config.evidence
        self.skipping = best == 0 and settled
        return k_max if peek or not settled else min(k_max, best)

    def choose_k(self, proposal_counts, compiled_ks):
        if compiled_ks != self.ks:
            ks = sorted(set(compiled_ks))
            if not ks:
                raise ValueError("no compiled K to choose from")
            if ks != self.ks:
                self.start(ks, max(self.rows, len(proposal_counts)), None)
        self.offered = sum(1 for n in proposal_counts if n) / max(len(proposal_counts), 1)
        if not self.offered:  # every K returns one token per row: the cheapest wins
            if self._cheapest is None:
                self._cheapest = min(self.ks, key=lambda k: (self.detour_cost(k), k))
            return self._cheapest
        return self.best(self.rates(proposal_counts, weights=self.row_weights()))

    def observe(self, outcome):
        a, k = self.config.cost_ema, outcome.k
        if k == self.last_k:
            self.verify_s[k] += a * (outcome.verify_s - self.verify_s[k])
        elif self.last_k is not None:
            excess = outcome.verify_s - self.verify_s[k]
            self.penalty_s += self.config.penalty_ema * (excess - self.penalty_s)
        host = self.host_s
        if host[k] is None:
            for key in host:  # shapes not run yet start from the first host time seen
                if host[key] is None:
                    host[key] = outcome.host_s
        host[k] += a * (outcome.host_s - host[k])
        if k != self.last_k or self._steps % 16 == 0:
            self._cheapest = None  # the cheapest K depends on the last K and drifts slowly
        self._steps += 1
        self.last_k = k
        if outcome.propose_s > 0:
            if self.propose_s is None:
                self.propose_s = outcome.propose_s
            self.propose_s += a * (outcome.propose_s - self.propose_s)
            self.calls += 1
            self.yield_rate += self.config.yield_ema * (self.offered - self.yield_rate)
            some = self.offered > 0
            if self._had_some:
                keep = 1.0 - self.config.yield_ema
                self.follows = [self.follows[0] * keep + 1.0, self.follows[1] * keep + some]
            self._had_some = some
            # A peek costs the proposer and about a step's host work (scoring, estimates).
            low = self.ks[0]
            peek_s = self.propose_s + (host[low] or 0.0)
            every = peek_s / max(self.config.peek_share * (self.verify_s[low] + (host[low] or 0.0)), 1e-9)
            self.peek_every = int(min(max(every, self.config.peek_min), self.config.peek_max))
        else:
            self._had_some = False
        if outcome.scored:
            fade = self.config.decay ** len(outcome.scored)
            tries = [t * fade for t in self.tries]
            hits = [h * fade for h in self.hits]
            for checked, matched in outcome.scored:
                for j in range(1, checked + 1):
                    tries[j] += 1.0
                for j in range(1, matched + 1):
                    hits[j] += 1.0
            self.tries, self.hits, self._extra = tries, hits, None
