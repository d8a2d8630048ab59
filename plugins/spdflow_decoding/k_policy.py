"""K policies: pick the compiled decode shape (K) of a step from the batch's proposal counts.

The compiled K-list is given sorted and deduplicated. ``smallest_covering`` is the varK policy
of DESIGN §4 (QEfficient PR #984's ``_select_k``, except that an empty batch gets the smallest K:
nothing to verify should cost the cheapest shape, not the largest).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from spdflow.api import KPolicy


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


class SmallestCovering(KPolicy):
    """varK: the smallest compiled K that verifies every proposal of the step."""

    name = "smallest_covering"

    def choose_k(self, proposal_counts, compiled_ks):
        return smallest_covering_k(proposal_counts, compiled_ks)


class FixedK(KPolicy):
    """Always the largest compiled K, as a fixed-K SpD system would run."""

    name = "fixed"

    def choose_k(self, proposal_counts, compiled_ks):
        if not compiled_ks:
            raise ValueError("no compiled K to choose from")
        return max(compiled_ks)


class NoSpec(KPolicy):
    """Always K = 0: the no-spec baseline on the same compiled program."""

    name = "nospec"

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
    row-steps, older ones fading by ``DECAY`` per row). Each position starts from a prior of
    ``PRIOR_WEIGHT`` pseudo-trials at the estimate of the position before it (the first at
    ``PRIOR_ACCEPT``), so positions a smaller K never tried are assumed as good as the last tried
    one rather than stuck at a constant. A row with n proposals is then worth
    ``1 + sum_{j <= min(n, K)} prod_{i <= j} accept[i]`` tokens. What it costs is the verify time
    of K plus the host time of a step: the engine times each compiled shape once per session
    (``step_costs``), and the estimate then follows the verify times the steps really take
    (which include what switching shapes costs: on the CPU backend each shape has its own packed
    weights, so a switch runs from colder caches). The policy picks
    ``argmax_K tokens(K) / cost(K)``, ties going to the smaller K, and truncates proposals
    longer than K. Leaving K = 0 to speculate must win by ``MARGIN``: estimates are noisy, and rows that speculate drift apart, which
    leaves a static batch running with idle rows at the end; a near tie is not worth that.

    When no request waits for a slot, a batch finishes with its last row: a row's tokens are
    then weighted by its tokens left over the most any row has left, so the rows that hold the
    batch up decide, and rows far ahead (which would sit idle soon anyway) count less.

    Before the proposer runs, ``propose_budget`` asks: would full-length proposals, from the
    share of rows that recently returned one, beat K = 0, counting the proposer's own time? If not, the step does not call the
    proposer at all, and only a probe step (the cheapest K > 0, every 16 skipped steps,
    backing off to every 256 while probes accept nothing, back to 16 when one accepts) keeps
    the acceptance estimate current.
    So where proposals rarely land, the run costs about what no-spec costs.
    """

    name = "goodput"
    wants_step_costs = True

    PRIOR_ACCEPT = 0.6
    PRIOR_WEIGHT = 4.0
    DECAY = 0.98
    COST_EMA = 0.05
    YIELD_EMA = 0.1
    PROBE_FIRST, PROBE_LAST = 16, 256
    MARGIN = 0.1

    def __init__(self):
        self.start([0], 1, None)

    def start(self, compiled_ks, rows, step_costs):
        self.ks = sorted(set(compiled_ks))
        self.rows = rows
        size = self.ks[-1] + 1
        # Index j is proposal position j (1-based); index 0 is unused.
        self.tries = np.zeros(size)
        self.hits = np.zeros(size)
        self.verify_s = {k: float(step_costs[k]) if step_costs else 1.0 for k in self.ks}
        self.last_k: int | None = None
        self.host_s = 0.0
        self.propose_s = 0.0
        self.yield_rate = 1.0  # share of rows that return a proposal when the proposer runs
        self.skipped = 0
        self.probe_every = self.PROBE_FIRST
        self.probing = False
        self.weights: list[float] | None = None
        self._extra: list[float] | None = None

    # -- estimates ----------------------------------------------------------------------------

    def expected_extra(self) -> list[float]:
        """``extra[n]``: expected accepted proposals of a row that proposes n tokens (cached)."""
        if self._extra is None:
            extra, run, previous = [0.0], 1.0, self.PRIOR_ACCEPT
            for j in range(1, len(self.tries)):
                previous = (self.hits[j] + self.PRIOR_WEIGHT * previous) / (self.tries[j] + self.PRIOR_WEIGHT)
                run *= previous
                extra.append(extra[-1] + run)
            self._extra = extra
        return self._extra

    def rates(self, proposal_counts: Sequence[int], extra_propose_s: float = 0.0,
              weights: Sequence[float] | None = None, share: float = 1.0) -> dict[int, float]:
        """Expected (weighted) tokens per second of each compiled K for rows proposing these counts.

        ``share`` scales what the proposals bring (the share of rows expected to get one).
        Plain Python on purpose: it runs every step, for a handful of rows and K values.
        """
        extra = self.expected_extra()
        if weights is None or len(weights) != len(proposal_counts):
            weights = [1.0] * len(proposal_counts)
        base = sum(weights)
        out = {}
        for k in self.ks:
            tokens = base + share * sum(w * extra[min(n, k)] for w, n in zip(weights, proposal_counts) if n)
            cost = self.verify_s[k] + self.host_s + (extra_propose_s if k else 0.0)
            out[k] = tokens / max(cost, 1e-9)
        return out

    def best(self, rates: dict[int, float]) -> int:
        """The K of the highest rate (ties to the smaller K); leaving K = 0 must win by MARGIN."""
        if 0 in rates and self.last_k in (0, None):
            floor = rates[0] * (1.0 + self.MARGIN)
            rates = {k: r for k, r in rates.items() if k == 0 or r > floor}
        return max(rates, key=lambda k: (rates[k], -k))

    # -- the KPolicy protocol -----------------------------------------------------------------

    def propose_budget(self, k_max, step):
        self.probing = False
        left = step.tokens_left
        most = max(left, default=0)
        self.weights = None if step.waiting or most <= 0 else [n / most for n in left]
        if 0 not in self.ks:
            return k_max
        # What full-length proposals could bring from the rows that usually propose, paying
        # the proposer as well.
        full = [self.ks[-1]] * len(left)
        best = self.best(self.rates(full, self.propose_s, self.weights, share=self.yield_rate))
        if best > 0:
            self.skipped = 0
            self.probe_every = self.PROBE_FIRST
            return min(k_max, best)
        self.skipped += 1
        if self.skipped >= self.probe_every:
            self.skipped = 0
            self.probe_every = min(2 * self.probe_every, self.PROBE_LAST)
            self.probing = True
            return min(k_max, self.ks[1]) if len(self.ks) > 1 else 0
        return 0

    def choose_k(self, proposal_counts, compiled_ks):
        ks = sorted(set(compiled_ks))
        if not ks:
            raise ValueError("no compiled K to choose from")
        if ks != self.ks:
            self.start(ks, max(self.rows, len(proposal_counts)), None)
        if not any(proposal_counts):  # every K returns one token per row: the cheapest wins
            return min(ks, key=lambda k: (self.verify_s[k], k))
        if self.probing:
            return smallest_covering_k(proposal_counts, ks)
        return self.best(self.rates(proposal_counts, weights=self.weights))

    def observe(self, outcome):
        a, k = self.COST_EMA, outcome.k
        self.verify_s[k] += a * (outcome.verify_s - self.verify_s[k])
        self.last_k = k
        self.host_s += a * (outcome.host_s - self.host_s)
        if outcome.propose_s > 0:
            self.propose_s += a * (outcome.propose_s - self.propose_s)
            share = sum(1 for n in outcome.proposed if n) / max(len(outcome.proposed), 1)
            self.yield_rate += self.YIELD_EMA * (share - self.yield_rate)
        if self.probing and any(outcome.accepted):
            self.probe_every = self.PROBE_FIRST  # the probe paid: look again soon
        for proposed, accepted in zip(outcome.proposed, outcome.accepted):
            if proposed == 0:
                continue
            self._extra = None
            self.tries *= self.DECAY
            self.hits *= self.DECAY
            last = min(accepted + 1, proposed)  # positions 1..last were tried
            self.tries[1 : last + 1] += 1.0
            self.hits[1 : accepted + 1] += 1.0
