"""K policies: the varK rule of DESIGN §4 and QEfficient PR #984's table."""
from __future__ import annotations

import pytest

from spdflow.plugins import get_plugin_manager
from spdflow_decoding import FixedK, NoSpec, SmallestCovering, smallest_covering_k


@pytest.mark.parametrize(
    "counts, ks, expected",
    [
        # QEfficient PR #984's table.
        ([0, 0, 0], [0, 3], 0),
        ([0, 3, 3], [0, 3], 3),
        ([0, 0], [3], 3),
        ([1, 2], [0, 2, 4], 2),
        ([5, 5], [0, 3], 3),
        # More rows.
        ([1], [0, 2, 4], 2),
        ([3, 0, 1], [0, 2, 4], 4),
        ([4], [1, 2, 4, 7], 4),
        ([0], [1, 2, 4, 7], 1),
        ([7, 8], [1, 2, 4, 7], 7),
        ([2], [4, 0, 2], 2),  # an unsorted K-list is still handled
    ],
)
def test_smallest_covering_picks_the_smallest_k_that_covers_the_batch(counts, ks, expected):
    assert SmallestCovering().choose_k(counts, ks) == expected


@pytest.mark.parametrize("ks, expected", [([0, 3], 0), ([3], 3), ([1, 2, 4], 1)])
def test_smallest_covering_gives_an_empty_batch_the_smallest_k(ks, expected):
    assert smallest_covering_k([], ks) == expected


def test_fixed_always_takes_the_largest_k():
    assert FixedK().choose_k([0, 0], [0, 2, 4]) == 4
    assert FixedK().choose_k([], [3]) == 3


def test_nospec_takes_zero_and_refuses_a_k_list_without_it():
    assert NoSpec().choose_k([3, 3], [0, 3]) == 0
    with pytest.raises(ValueError, match="K = 0"):
        NoSpec().choose_k([3], [1, 3])


def test_k_policies_and_acceptors_are_registered_through_the_entry_point():
    registry = get_plugin_manager().registry()
    assert {"smallest_covering", "fixed", "nospec"} <= set(registry["k_policy"])
    assert {"greedy", "rejection"} <= set(registry["acceptor"])
    assert registry["k_policy"]["smallest_covering"].factory().choose_k([1], [0, 2]) == 2
