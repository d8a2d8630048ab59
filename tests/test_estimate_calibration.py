"""benchmarks/estimate_calibration.py: goodput's expectations beside what rows accepted."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO, load_benchmark, record_code_run
from spdflow.api import CostModel


@pytest.fixture(scope="module")
def calibration():
    sys.path.insert(0, str(REPO / "benchmarks"))
    return load_benchmark("estimate_calibration")


def test_the_tally_counts_only_rows_that_proposed_by_k_and_last_outcome(calibration):
    log = [(2, [(0.5, 1.0, 7, 0, 1), (1.5, 1.0, 0, 2, None)], (1, 0)),  # the second row proposed nothing
           (2, [(0.7, 1.2, 3, 0, 3), (1.6, 1.1, 7, 2, 3)], (0, 2)),
           (7, [(3.0, 2.0, 7, None, None)], (6,))]
    cells = calibration.tally(log)
    assert cells == {(2, 0): [2, pytest.approx(1.2), pytest.approx(2.2), 1], (2, 2): [1, 1.6, 1.1, 2],
                     (7, None): [1, 3.0, 2.0, 6]}
    text = calibration.render(cells)
    assert "| 2 | missed | 2 | 0.60 | 1.10 | 0.50 | 0.83 |" in text
    assert "| 7 | none yet / not read | 1 | 3.00 | 2.00 | 6.00 | 2.00 |" in text
    graded = calibration.tally(log, "grade")
    assert graded == {(2, 1): [1, 0.5, 1.0, 1], (2, 3): [2, pytest.approx(2.3), pytest.approx(2.3), 2],
                      (7, None): [1, 3.0, 2.0, 6]}
    text = calibration.render(graded, "grade")
    assert "| 2 | 3 | 2 | 1.15 | 1.15 | 1.00 | 0.87 |" in text and "| 7 | none | 1 |" in text


def test_quarters_follow_each_requests_own_order(calibration):
    # request 1 holds more as it goes on; request 2 has two proposals, one in quarters 0 and 2
    scored = [(1, 1, 0, 1), (2, 7, 7, 3), (1, 2, 1, 1), (1, 7, 7, 3), (2, 1, 0, 1), (1, 7, 7, None)]
    assert calibration.by_quarter(scored) == [(2, 3.5, 0.5), (1, 1.0, 1.0), (2, 3.5, 0.5), (1, 7.0, 1.0)]
    assert calibration.by_grade(scored) == {1: (3, pytest.approx(1 / 3), pytest.approx(1 / 3)), 3: (2, 7.0, 1.0),
                                            None: (1, 7.0, 1.0)}


class SteadyCosts(CostModel):
    """Verify priced at 1 ms + 0.05 ms per proposal position, no switch cost: speculation pays."""

    name = "steady-test"

    def verify_s(self, batch, k):
        return 1e-3 * (1.0 + 0.05 * k)


def test_a_recorded_run_is_tallied_under_the_replays_goodput(calibration, tmp_path, monkeypatch):
    # The replay prices steps with the recorded run's own timings by default. Recorded on a loaded
    # 2-core machine, those once rated K = 2 at 4x K = 0: the replayed goodput then never
    # speculated and nothing was tallied. Fixed prices keep this test about the tally.
    real = calibration.k_policy_replay.load_for_replay

    def steady_prices(pm, run_dir, steady, noise):
        run, measured = real(pm, run_dir, steady, noise)
        cost = SteadyCosts()
        cost.propose_per_call_s = measured.propose_per_call_s
        return run, cost

    monkeypatch.setattr(calibration.k_policy_replay, "load_for_replay", steady_prices)
    record_code_run(tmp_path / "runs")
    results = calibration.calibrate(tmp_path / "runs", [1], {"evidence": 2})
    cells, quarters = results["code"][1]["cells"], results["code"][1]["quarters"]
    graded, grades = results["code"][1]["graded"], results["code"][1]["grades"]
    assert set(grades) <= {1, 2, 3} and grades  # prompt lookup grades every proposal by its matched n-gram
    assert sum(n for n, _, _ in grades.values()) == sum(n for n, _, _ in quarters)
    assert sum(c[0] for c in graded.values()) == sum(c[0] for c in cells.values())
    assert sum(n for n, _, _ in quarters) >= sum(rows for rows, _, _, _ in cells.values())
    assert all(0.0 <= first <= 1.0 and 0.0 <= held <= 7 for _, held, first in quarters)
    assert cells, "no settled step with proposals was noted"
    for (k, outcome), (rows, own, pooled, accepted) in cells.items():
        assert k in (2, 4, 7) and outcome is None  # batch 1: outcomes are not read
        assert rows > 0 and 0 < own <= k * rows and 0 < pooled <= k * rows and 0 <= accepted <= k * rows
