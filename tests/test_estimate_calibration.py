"""benchmarks/estimate_calibration.py: goodput's expectations beside what rows accepted."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO, load_benchmark, record_code_run


@pytest.fixture(scope="module")
def calibration():
    sys.path.insert(0, str(REPO / "benchmarks"))
    return load_benchmark("estimate_calibration")


def test_the_tally_counts_only_rows_that_proposed_by_k_and_last_outcome(calibration):
    log = [(2, [(0.5, 1.0, 7, 0), (1.5, 1.0, 0, 2)], (1, 0)),  # the second row proposed nothing
           (2, [(0.7, 1.2, 3, 0), (1.6, 1.1, 7, 2)], (0, 2)),
           (7, [(3.0, 2.0, 7, None)], (6,))]
    cells = calibration.tally(log)
    assert cells == {(2, 0): [2, pytest.approx(1.2), pytest.approx(2.2), 1], (2, 2): [1, 1.6, 1.1, 2],
                     (7, None): [1, 3.0, 2.0, 6]}
    text = calibration.render(cells)
    assert "| 2 | missed | 2 | 0.60 | 1.10 | 0.50 | 0.83 |" in text
    assert "| 7 | none yet / not read | 1 | 3.00 | 2.00 | 6.00 | 2.00 |" in text


def test_quarters_follow_each_requests_own_order(calibration):
    # request 1 holds more as it goes on; request 2 has two proposals, one in quarters 0 and 2
    scored = [(1, 1, 0), (2, 7, 7), (1, 2, 1), (1, 7, 7), (2, 1, 0), (1, 7, 7)]
    assert calibration.by_quarter(scored) == [(2, 3.5, 0.5), (1, 1.0, 1.0), (2, 3.5, 0.5), (1, 7.0, 1.0)]


def test_a_recorded_run_is_tallied_under_the_replays_goodput(calibration, tmp_path):
    record_code_run(tmp_path / "runs")
    results = calibration.calibrate(tmp_path / "runs", [1], {"evidence": 2})
    cells, quarters = results["code"][1]["cells"], results["code"][1]["quarters"]
    assert sum(n for n, _, _ in quarters) >= sum(rows for rows, _, _, _ in cells.values())
    assert all(0.0 <= first <= 1.0 and 0.0 <= held <= 7 for _, held, first in quarters)
    assert cells, "no settled step with proposals was noted"
    for (k, outcome), (rows, own, pooled, accepted) in cells.items():
        assert k in (2, 4, 7) and outcome is None  # batch 1: outcomes are not read
        assert rows > 0 and 0 < own <= k * rows and 0 < pooled <= k * rows and 0 <= accepted <= k * rows
