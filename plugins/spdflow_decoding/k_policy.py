"""K policies: pick the compiled decode shape (K) of a step from the batch's proposal counts.

The compiled K-list is given sorted and deduplicated. ``smallest_covering`` is the varK policy
of DESIGN §4 (QEfficient PR #984's ``_select_k``, except that an empty batch gets the smallest K:
nothing to verify should cost the cheapest shape, not the largest). ``goodput`` is in
``goodput.py`` (cost model, acceptance estimator, decision rule).
"""
from __future__ import annotations

from typing import Sequence

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
