"""benchmarks/k_policy_sim.py: the simulated machine, paired generations, the table and the CLI."""
from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def sim():
    return load_benchmark("k_policy_sim")


def steady(sim, seconds=100.0):
    return sim.Trace([0.0, seconds], [1.0, 1.0])


def test_recorded_traces_load_and_time_their_steps(sim):
    traces = sim.load_traces()
    assert len(traces) >= 16
    for trace in traces:
        assert trace.start == sorted(trace.start) and trace.length_s > 0.5  # most are 0.9-1.9 s
        assert 0.9 < sorted(trace.factor)[len(trace.factor) // 2] < 1.1  # factors are over the run's median
    trace = sim.Trace.from_record({"factor": [1.0, 2.0], "median_step_ms": 1.5})
    assert trace.start == pytest.approx([0.0, 0.0015, 0.0045])
    machine = sim.Machine(trace, sim.verify_ms(1.1), 0.0, 0.0, offset_s=0.002)
    assert machine.speed() == 2.0
    machine.t = 0.0045 + 0.001  # past the end: the trace starts again
    assert machine.speed() == 1.0


def test_changing_k_costs_the_first_step_and_a_tail(sim):
    verify = sim.verify_ms(1.1)
    machine = sim.Machine(steady(sim), verify, first_ms=0.3, tail_ms=0.7, offset_s=0.0)
    steps = [machine.step(2, 0.0)[0] for _ in range(3)] + [machine.step(4, 0.0)[0] for _ in range(15)]
    assert steps[:3] == pytest.approx([verify[2] / 1e3] * 3)
    extra = [s - verify[4] / 1e3 for s in steps[3:]]
    assert extra[0] == pytest.approx(0.3e-3)
    assert sum(extra[1:12]) == pytest.approx(0.7e-3) and extra[1] > extra[11] > 0
    assert extra[12:] == pytest.approx([0.0] * 3)


def test_policies_meet_the_same_draws_and_drift(sim):
    class AlwaysTwo(sim.Fixed):  # a policy answering K=2 on every step is fixed K=2, to the bit
        def __init__(self):
            super().__init__(2)

    trace = sim.load_traces()[0]
    rates = [sim.generate(policy, 0.6, sim.Machine(trace, sim.verify_ms(1.1), 0.33, 0.7, 0.1), seed=3,
                          grid_noise=0.1, grid_bias=1.0, requests=2)
             for policy in (sim.Fixed(2), AlwaysTwo())]
    assert rates[0] == rates[1]
    other_seed = sim.generate(sim.Fixed(2), 0.6, sim.Machine(trace, sim.verify_ms(1.1), 0.33, 0.7, 0.1), seed=4,
                              grid_noise=0.1, grid_bias=1.0, requests=2)
    assert other_seed != rates[0]


def test_static_choices_rank_as_acceptance_and_cost_say_on_a_steady_machine(sim):
    def rate(k, acceptance, ratio):
        machine = sim.Machine(steady(sim), sim.verify_ms(ratio), 0.33, 0.7, 0.0)
        return sim.generate(sim.Fixed(k), acceptance, machine, seed=0, grid_noise=0.0, grid_bias=1.0, requests=4)

    high = {k: rate(k, 0.9, 1.1) for k in sim.KS}
    assert high[7] > high[4] > high[2] > high[0]
    low = {k: rate(k, 0.3, 1.18) for k in sim.KS}
    assert max(low, key=low.get) == 2 and low[7] < low[2]
    # no-spec: one token a step of K=0's verify + host time
    assert rate(0, 0.9, 1.1) == pytest.approx(1e3 / (sim.VERIFY_K0_MS + sim.HOST_MS[0]), rel=1e-6)


def test_goodput_runs_in_the_simulator_and_the_table_reports_each_variant(sim, capsys):
    assert sim.main(["--runs", "2", "--acceptance", "0.9", "--ratio", "1.1", "--requests", "2",
                     "--variant", "default", "--variant", "follow=0.8"]) == 0
    out = capsys.readouterr().out
    assert "| 0.9 | 1.1 | fixed K=7 (" in out
    assert "default: median (min-max)" in out and "follow=0.8: runs >= 0.97" in out
    rows = [line for line in out.splitlines() if line.startswith("| 0.9")]
    ratios = [float(cell.split()[0]) for cell in rows[0].split("|")[4:6]]
    assert all(0.8 < r < 1.05 for r in ratios)  # goodput ends near the best fixed K at 0.9
    assert "recorded drift" in out
    assert sim.main(["--runs", "1", "--acceptance", "0.3", "--ratio", "1.1", "--requests", "1", "--no-drift"]) == 0
    assert "no drift" in capsys.readouterr().out


def test_variants_parse_and_bad_ones_say_how(sim, capsys):
    assert sim.parse_variant("default") == {}
    assert sim.parse_variant("follow=0.5,evidence=16") == {"follow": 0.5, "evidence": 16}
    with pytest.raises(SystemExit, match="key=value"):
        sim.parse_variant("follow")
    with pytest.raises(SystemExit):
        sim.main(["--runs", "0"])
    for bad, said in [("follow=2", "follow"), ("folow=0.5", "folow")]:  # out of range; not a goodput setting
        with pytest.raises(SystemExit):
            sim.main(["--runs", "1", "--variant", bad])
        assert f"goodput setting '{said}'" in capsys.readouterr().err
