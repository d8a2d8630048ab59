"""benchmarks/k_policy_replay.py: goodput fed steady timings, the regret table, one replay end to end."""
from __future__ import annotations

import random
import sys

import pytest

from spdflow.api import StepContext, StepOutcome

from conftest import REPO, load_benchmark, record_code_run


@pytest.fixture(scope="module")
def replay():
    sys.path.insert(0, str(REPO / "benchmarks"))
    return load_benchmark("k_policy_replay")


def test_steady_goodput_sees_the_recorded_means_not_the_replays_timings(replay):
    from spdflow_decoding import GoodputConfig

    _, steady = replay.steady_plugin({})
    steady.idle_host_s, steady.busy_host_s, steady.propose_s, steady.noise = 0.0015, 0.002, 0.001, 0.0
    policy = steady(GoodputConfig())
    policy.start([0, 2, 4], 1, None)
    policy.propose_budget(4, StepContext((10,), 0, 1, (0,)))
    policy.choose_k([4], [0, 2, 4])
    policy.observe(StepOutcome(4, (4,), (4,), 0.5, 0.123, 0.456))
    assert policy.costs.host_s[4] == pytest.approx(0.002)  # a step that ran the proposer: the drafting steps' mean
    assert policy.costs.propose_s == pytest.approx(0.001)
    policy.observe(StepOutcome(0, (0,), (0,), 0.5, 0.0, 0.456))
    assert policy.costs.host_s[0] == pytest.approx(0.002 + 0.05 * (0.0015 - 0.002))  # one without it: theirs
    # with noise, each seed is its own repeatable machine
    steady.noise = 0.2
    draws = []
    for _ in range(2):
        steady.rng = random.Random("seed")
        policy = steady(policy.config)
        policy.start([0, 2, 4], 1, None)
        policy.observe(StepOutcome(0, (0,), (0,), 0.5, 0.0, 0.456))
        draws.append(policy.costs.host_s[0])
    assert draws[0] == draws[1] != 0.0015


def test_host_means_keep_steps_with_and_without_the_proposer_apart(replay, tmp_path):
    import json

    steps = [{"kind": "step", "k": 0, "host_s": 0.1, "propose_s": 0.0}] * 6 + \
            [{"kind": "step", "k": 2, "host_s": 0.3, "propose_s": 0.01}] * 6
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(s) for s in steps))
    assert replay.host_means(tmp_path) == pytest.approx((0.1, 0.3))
    # fewer than 5 of a kind: the mean of every step for that kind
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(s) for s in steps[4:]))
    assert replay.host_means(tmp_path) == pytest.approx(((2 * 0.1 + 6 * 0.3) / 8, 0.3))


def test_the_table_marks_cells_below_the_line(replay):
    results = {"code": {1: {"regret": [-0.01, 0.02, -0.05]}, 8: {"regret": [-0.06, -0.04, -0.05]}}}
    text = replay.render(results, [1, 8])
    assert "| code | -1.0 % (-5.0..+2.0) | -5.0 % (-6.0..-4.0) **below** |" in text
    assert "Cells below the 0.97 line: 1 of 2; worst median -5.0 %" in text


def test_a_recorded_run_replays_under_steady_goodput(replay, tmp_path):
    record_code_run(tmp_path / "runs")
    results = replay.replay_all(tmp_path / "runs", "goodput", {"margin": 0.05}, [1], seeds=2, noise=0.2)
    cells = results["code"]
    assert set(cells) == {1}
    for cell in cells.values():
        assert len(cell["regret"]) == 2 and all(-1.0 < r < 1.0 for r in cell["regret"])
        assert all(0.0 < e <= 1.5 for e in cell["efficiency"])


def test_the_replays_print_the_cost_models_cautions(replay, tmp_path, monkeypatch, capsys):
    # e.g. a K the recorded run held only in short spells, priced at its slow steps after a change
    record_code_run(tmp_path / "runs")
    real = replay.load_for_replay

    def cautious(*args):
        run, cost = real(*args)
        cost.cautions = lambda batch: [f"K=0 looks dear at batch {batch}"]
        return run, cost

    monkeypatch.setattr(replay, "load_for_replay", cautious)
    replay.replay_all(tmp_path / "runs", "smallest_covering", {}, [1, 2], seeds=1, noise=0.0)
    err = capsys.readouterr().err
    assert "code b1: caution: K=0 looks dear at batch 1" in err and "code b2: caution: K=0 looks dear at batch 2" in err


def test_make_runs_times_every_grid_before_any_replay(replay, tmp_path, monkeypatch):
    # Replays started together once timed each other's load into the grids they priced with:
    # the grids are timed when the runs are made, one run at a time, at every batch size.
    from spdflow import whatif as wi

    timed = []

    class Cost:
        grid = {}

        def prepare(self, needs):
            timed.append(needs)

    class Run:
        class recipe:
            @staticmethod
            def k_list():
                return [2, 4, 7]

    calls = []
    monkeypatch.setattr(replay.subprocess, "run", lambda command, **kw: calls.append(command))
    monkeypatch.setattr(wi, "load_run", lambda run_dir, pm: Run)
    monkeypatch.setattr(wi, "make_cost_model", lambda pm, run, name: Cost())
    replay.make_runs(tmp_path, ["code", "rare"], 4, 0, [1, 2, 8])
    assert len(calls) == 2 and all("specialization.batch_size=1" in c for c in calls)
    assert timed == [{1: [0, 2, 4, 7], 2: [0, 2, 4, 7], 8: [0, 2, 4, 7]}] * 2
