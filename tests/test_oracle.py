"""The oracle K schedule: exact shortest path (checked against brute force), never slower than
any static choice, and the policy's efficiency and regret priced alike."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from spdflow.api import CostModel
from spdflow.cli import cli
from spdflow.oracle import StepPrices, batch_schedule, best_schedule, fixed_time, oracle_report
from spdflow.plugins import get_plugin_manager
from spdflow.testing.fixtures import CODE_PROMPTS, run_in_process, tiny_recipe, write_recipe
from spdflow.whatif import load_run


class Costs(CostModel):
    """Made-up step costs; ``includes_host`` so a replay's time is priced time only (exact)."""

    name = "made-up"
    includes_host = True

    def __init__(self, verify: dict[int, float], switch: float = 0.0, prefill: float = 0.003):
        self.verify, self.switch, self.prefill = verify, switch, prefill

    def verify_s(self, batch, k):
        return self.verify[k]

    def switch_s(self, batch):
        return self.switch

    def prefill_s(self, batch, seq_len):
        return self.prefill

    def describe(self):
        return {"cost_model": self.name}


def brute_force(m, n, ks, cost) -> float:
    """Every schedule, recursively (small n only)."""
    def go(e, previous):
        if e >= n:
            return 0.0
        best = float("inf")
        for k in ks:
            step = min(k, int(m[e]), n - e - 1) + 1
            t = cost.verify[k] + (cost.switch if k != previous else 0.0) + go(e + step, k)
            best = min(best, t)
        return best
    return go(1, "prefill")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 14), data=st.data())
def test_best_schedule_is_the_shortest_path(n, data):
    m = np.array([0] + data.draw(st.lists(st.integers(0, 6), min_size=max(n - 1, 0), max_size=max(n - 1, 0))) + [0])
    ks = sorted(data.draw(st.sets(st.integers(1, 6), min_size=0, max_size=3)) | {0})
    verify = {k: data.draw(st.floats(0.5, 5.0)) for k in ks}
    cost = Costs(verify, switch=data.draw(st.floats(0.0, 2.0)))
    total, schedule = best_schedule(m, n, ks, cost)
    assert total == pytest.approx(brute_force(m, n, ks, cost) if n > 1 else 0.0)
    # the schedule reaches the end and costs what it says
    e, t, previous = 1, 0.0, "prefill"
    for k in schedule:
        t += verify[k] + (cost.switch if k != previous else 0.0)
        e += min(k, int(m[e]), n - e - 1) + 1
        previous = k
    assert (e >= n or n <= 1) and t == pytest.approx(total)


def test_best_schedule_speculates_where_proposals_hold_and_not_where_they_fail():
    cost = Costs({0: 1.0, 4: 2.0})
    assert best_schedule(np.full(21, 4), 21, [0, 4], cost)[1] == [4, 4, 4, 4]  # 1 + 4 x 5 tokens
    assert best_schedule(np.zeros(6), 6, [0, 4], cost)[1] == [0] * 5


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("oracle")
    recipe = tiny_recipe("spdflow:tinycode-target", base / "run", name="oracle", prompts=CODE_PROMPTS[:3],
                         max_new_tokens=40, proposer={"uses": "prompt_lookup",
                                                      "with": {"prompt_lookup_min": 1, "prompt_lookup_max": 3}},
                         k_list=(0, 2, 4, 7))
    run_in_process(get_plugin_manager(), write_recipe(base / "recipe.yaml", recipe), check_lossless=False)
    return base / "run"


def test_oracle_is_never_slower_than_the_policy_or_any_static_choice(greedy_run):
    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    cost = Costs({0: 0.010, 2: 0.013, 4: 0.016, 7: 0.021}, switch=0.001)
    report = oracle_report(pm, run, cost, "smallest_covering")
    static = [report.nospec_tokens_per_s, *report.fixed_tokens_per_s.values()]
    assert report.oracle_tokens_per_s >= max(static) * (1 - 1e-9)
    assert report.oracle_tokens_per_s >= report.policy_tokens_per_s * (1 - 1e-9)
    assert report.efficiency == pytest.approx(report.policy_tokens_per_s / report.oracle_tokens_per_s)
    assert report.regret == pytest.approx(report.policy_tokens_per_s / max(static) - 1)
    assert sum(report.oracle_k_usage.values()) == report.oracle_steps
    # when speculating costs nothing extra, the oracle always drafts the most it can use
    flat = oracle_report(pm, run, Costs({0: 0.01, 2: 0.01, 4: 0.01, 7: 0.01}), "smallest_covering")
    assert flat.oracle_tokens_per_s == pytest.approx(flat.fixed_tokens_per_s[7], rel=1e-9)


def test_whatif_oracle_cli_prints_efficiency_and_regret(greedy_run):
    result = CliRunner().invoke(cli, ["whatif", str(greedy_run), "--oracle", "--cost", "roofline", "--cost-with", "profile=ai100-ultra", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert 0 < data["policy_efficiency"] <= 1 + 1e-9 and "regret_vs_best_static" in data
    text = CliRunner().invoke(cli, ["whatif", str(greedy_run), "--oracle", "--cost", "roofline", "--cost-with", "profile=ai100-ultra"]).output
    assert "policy efficiency" in text and "| oracle (" in text


# ------------------------------------------------------------------------------ batch > 1


def brute_force_batch(ms, ns, rows, continuous, ks, step, switch) -> float:
    """Every K sequence, through the generation loop's batch mechanics written out plainly
    (slots, admission, idle finished rows); small cases only."""
    def admit(slots, waiting, previous):
        while waiting < len(ns):
            if continuous:
                free = [s for s, x in enumerate(slots) if x is None]
            else:
                free = list(range(rows)) if all(x is None for x in slots) else []
            if not free:
                break
            for s in free:
                if waiting < len(ns):
                    slots[s] = [waiting, 1] if ns[waiting] > 1 else None  # n = 1: done at its prefill
                    waiting += 1
                    previous = "prefill"
            if any(x is not None for x in slots):
                break
        return slots, waiting, previous

    budgets = sorted(ms[0]) if isinstance(ms[0], dict) else [None]
    actions = [(k, b) for k in ks for b in budgets if b is None or k == 0 or b >= k]

    def go(slots, waiting, previous):
        if all(x is None for x in slots):
            return 0.0
        best = float("inf")
        for k, b in actions:
            after = []
            for x in slots:
                if x is None:
                    after.append(None)
                    continue
                i, e = x
                m = ms[i] if b is None else ms[i][b]
                e += min(k, int(m[e]), ns[i] - e - 1) + 1
                after.append([i, e] if e < ns[i] else None)
            state = admit(after, waiting, k)
            best = min(best, step[k] + (switch if previous != k else 0.0) + go(*state))
        return best

    return go(*admit([None] * rows, 0, "prefill"))


@st.composite
def workloads(draw, requests=(1, 3), longest=6):
    count = draw(st.integers(*requests))
    ns = [draw(st.integers(1, longest)) for _ in range(count)]
    ms = [np.array([0] + [draw(st.integers(0, 4)) for _ in range(max(n - 1, 0))] + [0]) for n in ns]
    ks = sorted(draw(st.sets(st.integers(1, 4), min_size=1, max_size=2)) | {0})
    step = {k: draw(st.floats(0.5, 3.0)) for k in ks}
    return ms, ns, ks, StepPrices(step, draw(st.floats(0.0, 1.5)))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(workload=workloads(), rows=st.integers(1, 3), continuous=st.booleans())
def test_batch_schedule_equals_brute_force_on_tiny_workloads(workload, rows, continuous):
    ms, ns, ks, prices = workload
    found = batch_schedule(ms, ns, rows, continuous, ks, prices, width=10_000)
    assert found.exact
    assert found.seconds == pytest.approx(brute_force_batch(ms, ns, rows, continuous, ks, prices.step, prices.switch))
    # the schedule it returns finishes the workload and costs what it says
    assert priced(ms, ns, rows, continuous, found.schedule, prices) == pytest.approx(found.seconds)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(workload=workloads(), rows=st.integers(1, 3), continuous=st.booleans(), data=st.data())
def test_batch_schedule_chooses_the_draft_budget_too(workload, rows, continuous, data):
    """A proposer may draft differently for another budget: every K may verify a proposal drafted
    for any budget b ≥ K of the list, cut to K (the search weighs each)."""
    ms, ns, ks, prices = workload
    budgets = [k for k in ks if k > 0]
    by_budget = [{b: np.array([data.draw(st.integers(0, b)) for _ in range(len(m))]) for b in budgets} for m in ms]
    found = batch_schedule(by_budget, ns, rows, continuous, ks, prices, width=10_000)
    assert found.exact
    assert found.seconds == pytest.approx(brute_force_batch(by_budget, ns, rows, continuous, ks, prices.step,
                                                            prices.switch))
    for k in ks:  # fixed K drafts for budget K
        assert found.seconds <= fixed_time(by_budget, ns, rows, continuous, k, prices, ks).seconds * (1 + 1e-9)


def priced(ms, ns, rows, continuous, schedule, prices) -> float:
    """Run ``schedule`` through the mechanics; fail unless it ends exactly when the work does."""
    from spdflow.oracle import _Batch, _Work

    work = _Work(ms, ns, sorted(prices.step))
    batch = _Batch(work, list(range(len(ns))), rows, continuous)
    state, total = batch.start(), 0.0
    for k in schedule:
        assert state[0], "the schedule runs past the end of the workload"
        total += prices.step[k] + (prices.switch if state[2] != k else 0.0)
        state = batch.step(state, work.action_of(k))
    assert not state[0], "the schedule stops before the workload ends"
    return total


@settings(max_examples=40, deadline=None, derandomize=True)
@given(workload=workloads(requests=(1, 4), longest=14), continuous=st.booleans())
def test_batch_schedule_at_batch_one_is_the_exact_dp(workload, continuous):
    ms, ns, ks, prices = workload
    cost = Costs(prices.step, prices.switch)
    found = batch_schedule(ms, ns, 1, continuous, ks, prices)
    assert found.exact
    assert found.seconds == pytest.approx(sum(best_schedule(m, n, ks, cost)[0] for m, n in zip(ms, ns)))
    # and the general search, run on one row, agrees
    from spdflow.oracle import _row_table, _search, _Work

    work = _Work(ms, ns, ks)
    tables = [_row_table(work, i, prices) for i in range(len(ns))]
    searched = _search(work, tables, list(range(len(ns))), 1, True, prices, 10_000)
    assert searched.exact and searched.seconds == pytest.approx(found.seconds)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(workload=workloads(requests=(2, 6), longest=12), rows=st.integers(2, 4), continuous=st.booleans(),
       width=st.integers(1, 4))
def test_a_narrow_beam_is_feasible_and_never_slower_than_a_fixed_k(workload, rows, continuous, width):
    ms, ns, ks, prices = workload
    found = batch_schedule(ms, ns, rows, continuous, ks, prices, width=width)
    exact = batch_schedule(ms, ns, rows, continuous, ks, prices, width=10_000)
    assert priced(ms, ns, rows, continuous, found.schedule, prices) == pytest.approx(found.seconds)
    assert found.seconds >= exact.seconds * (1 - 1e-9)
    for k in ks:
        assert found.seconds <= fixed_time(ms, ns, rows, continuous, k, prices).seconds * (1 + 1e-9)


@pytest.mark.parametrize("continuous", [False, True])
def test_oracle_at_batch_two_prices_static_choices_as_the_replay_does(greedy_run, continuous):
    """The oracle's batch mechanics are the loop's: K = k at every step, priced by the oracle,
    costs what the replay of fixed K = k costs; and the oracle beats or ties every one."""
    import dataclasses

    from spdflow.engine.run import Engine, NullUI, RunOptions
    from spdflow.oracle import lengths_for
    from spdflow.recipe.schema import REFERENCE_POLICY
    from spdflow.whatif import Scenario, replay

    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    if continuous:
        spec = run.recipe.specialization.model_copy(update={"full_batch_size": 2})
        run.loaded = dataclasses.replace(run.loaded, recipe=run.recipe.model_copy(update={"specialization": spec}))
    cost = Costs({0: 0.010, 2: 0.013, 4: 0.016, 7: 0.021}, switch=0.002)
    engine = Engine(pm, run.loaded, RunOptions(), NullUI())
    lengths, _, _ = lengths_for(pm, engine, run.model_info, run.requests, run.outputs, [2, 4, 7])
    ms = [lengths[r.index] for r in run.requests]
    ns = [len(run.outputs[r.index]) for r in run.requests]
    prices = StepPrices({k: cost.verify_s(2, k) for k in (0, 2, 4, 7)}, cost.switch_s(2))
    prefills = None
    for k in (0, 2, 4, 7):
        figures = replay(pm, run, Scenario((k,), REFERENCE_POLICY, 2), cost).figures
        mine = fixed_time(ms, ns, 2, continuous, k, prices)
        assert mine.steps == figures.steps
        assert mine.seconds == pytest.approx(figures.verify_s)
        prefills = figures.wall_s - figures.verify_s
    report = oracle_report(pm, run, cost, "smallest_covering", batch_size=2)
    assert report.batch_size == 2
    static = [report.nospec_tokens_per_s, *report.fixed_tokens_per_s.values()]
    assert report.oracle_tokens_per_s >= max(static) * (1 - 1e-9)
    found = batch_schedule(ms, ns, 2, continuous, [0, 2, 4, 7], prices)
    tokens = sum(ns)
    assert report.oracle_tokens_per_s == pytest.approx(tokens / (prefills + found.seconds))


def test_measured_steps_takes_trace_means_and_scales_the_grid_for_the_rest():
    from spdflow.costs import GridEntry
    from spdflow.oracle import MeasuredSteps

    steps = [{"kind": "step", "k": 0, "verify_s": 0.004}] * 5 + [{"kind": "step", "k": 0, "verify_s": 0.010}] * 5
    steps += [{"kind": "step", "k": 7, "verify_s": 0.1}] * 4  # too few: from the grid
    grid = GridEntry(2, {0: 0.005, 4: 0.006, 7: 0.008}, 0.001, None, 16, 3)
    cost = MeasuredSteps(2, [steps[:7], steps[7:]], grid)  # pooled over traces
    assert cost.verify_s(2, 0) == pytest.approx(0.007)
    assert cost.scale == pytest.approx(0.007 / 0.005)
    assert cost.verify_s(2, 7) == pytest.approx(0.008 * 1.4) and cost.switch_s(2) == pytest.approx(0.0014)
    assert cost.describe()["sources"] == {"0": "mean of 10 steps", "4": "grid × 1.400", "7": "grid × 1.400"}
    with pytest.raises(Exception, match="K = 2"):
        cost.verify_s(2, 2)


# ------------------------------------------------------------------------------ the run report


def test_the_run_report_has_the_oracle_of_a_greedy_run(greedy_run):
    from spdflow.report.model import load_report

    report = load_report(greedy_run / "report.json")
    o = report.oracle
    assert o is not None and o.computed, o
    assert o.batch_size == 1 and o.exact and o.label == "oracle" and o.seconds >= 0
    static = [o.nospec_priced_tokens_per_s, *o.fixed_priced_tokens_per_s.values()]
    assert set(o.fixed_priced_tokens_per_s) == {2, 4, 7}
    assert o.oracle_tokens_per_s >= max(static) * (1 - 1e-9)
    assert o.best_static_tokens_per_s == pytest.approx(max(static))
    assert o.policy_efficiency == pytest.approx(o.policy_priced_tokens_per_s / o.oracle_tokens_per_s)
    assert o.policy_efficiency <= 1 + 1e-9  # exact at batch 1
    assert o.regret_vs_best_static == pytest.approx(o.policy_priced_tokens_per_s / max(static) - 1)
    assert sum(o.oracle_k_usage.values()) == o.oracle_steps
    assert set(o.cost["verify_ms"]) == {"0", "2", "4", "7"}
    # the oracle's own time is outside the trace: the run's tokens/s is its generation's
    from spdflow.report.metrics import compute_metrics, read_trace

    assert report.metrics.e2e_tokens_per_s == pytest.approx(compute_metrics(read_trace(greedy_run / "trace.jsonl"))
                                                            .e2e_tokens_per_s)
    text = (greedy_run / "report.md").read_text()
    assert "## Oracle" in text and "policy efficiency" in text and "| this run's policy |" in text


@pytest.mark.parametrize("change, reason", [
    ({"workload": {"temperature": 0.8, "seed": 3}}, "sampled run"),
    ({"proposer": None, "num_speculative_tokens": [0]}, "no proposer ran"),
])
def test_the_run_report_says_why_there_is_no_oracle(tmp_path, change, reason):
    from spdflow.report.model import load_report

    recipe = tiny_recipe("spdflow:tinycode-target", tmp_path / "run", name="no-oracle", prompts=CODE_PROMPTS[:1],
                         max_new_tokens=8, proposer={"uses": "prompt_lookup"}, k_list=(0, 4))
    for key, value in change.items():
        if value is None:
            recipe.pop(key)
        elif isinstance(value, list):
            recipe[key] = value
        else:
            recipe[key] = {**recipe[key], **value}
    run_in_process(get_plugin_manager(), write_recipe(tmp_path / "recipe.yaml", recipe), check_lossless=False)
    o = load_report(tmp_path / "run" / "report.json").oracle
    assert o is not None and not o.computed and reason in o.reason
    assert f"Not computed: {reason}" in (tmp_path / "run" / "report.md").read_text()


def test_a_recorded_schedule_is_priced_like_an_oracle_step_not_by_its_own_timings():
    from spdflow.oracle import AFTER_PREFILL, StepPrices, priced_decode_s

    prices = StepPrices({0: 1.0, 2: 1.5, 4: 2.0}, switch=0.25)
    steps = [{"kind": "prefill"}] + [{"kind": "step", "k": k, "verify_s": 9.0, "host_s": host, "propose_s": host}
                                     for k, host in [(2, 0.0), (2, 5.0), (0, 0.0), (4, 0.0)]]
    # 1.5 + switch (after the prefill), 1.5, 1.0 + switch, 2.0 + switch: the run's own verify,
    # host and proposer times (a lucky quiet moment, or a slow one) do not enter
    assert priced_decode_s(steps, prices) == pytest.approx(1.5 + 1.5 + 1.0 + 2.0 + 3 * 0.25)
    assert AFTER_PREFILL not in prices.step


def test_a_recorded_k0_step_that_drafted_pays_a_drafting_steps_work():
    from spdflow.oracle import StepPrices, priced_decode_s

    prices = StepPrices({0: 1.0, 2: 1.5}, switch=0.0, zero_drafting=1.25)
    steps = [{"kind": "step", "k": 0, "verify_s": 9.0, "host_s": 0.0, "propose_s": p} for p in (0.0, 0.3, 0.0)]
    # the skipped steps cost step[0]; the one whose proposer ran (then verified none of it) zero_drafting
    assert priced_decode_s(steps, prices) == pytest.approx(1.0 + 1.25 + 1.0)
    assert priced_decode_s(steps, StepPrices({0: 1.0, 2: 1.5}, switch=0.0)) == pytest.approx(3.0)


def _step(k, host, propose=0.0):
    return {"kind": "step", "k": k, "verify_s": 1.0, "host_s": host, "propose_s": propose}


def test_step_overheads_come_from_the_static_runs_of_each_k():
    """A step's host and proposer time outside its verify run, per K: the static runs' own (no-spec
    for K = 0, fixed K for K > 0) where they have 5 steps at K; else the traces' steps that did (K > 0)
    or did not (K = 0) run the proposer. One mean of every step priced no-spec at drafting steps'
    host work (issue 23, round 29)."""
    from spdflow.oracle import step_overheads

    nospec = [[_step(0, 0.1)] * 6]
    fixed2 = [[_step(2, 0.3, 0.05)] * 6]
    policy = [[_step(2, 0.5, 0.05)] * 6 + [_step(0, 0.2)] * 6]
    traces = nospec + fixed2 + policy
    got = step_overheads(traces, [0, 2, 4], {0: nospec, 2: fixed2})
    assert got[0] == pytest.approx(0.1) and got[2] == pytest.approx(0.35)
    # K = 4 has no static run: the steps that ran the proposer (fixed 2's and the policy's K = 2 ones)
    assert got[4] == pytest.approx((6 * 0.3 + 6 * 0.5) / 12 + 0.05)
    # no static runs at all: K = 0 from the steps without the proposer, not the mean of every step
    alone = step_overheads(policy, [0, 2])
    assert alone[0] == pytest.approx(0.2) and alone[2] == pytest.approx(0.55)
    # too few steps of either kind: every step's mean, as before
    few = step_overheads([[_step(2, 0.5, 0.05)] * 3 + [_step(0, 0.2)] * 3], [0, 2])
    assert few[0] == pytest.approx(0.35) and few[2] == pytest.approx(0.35 + 0.05)


def test_the_bench_hands_the_oracle_its_static_runs_per_k():
    from spdflow.bench import BASELINE, ONE_K, VARK, ModeRun, static_traces

    def run(mode, role, marker):
        return ModeRun(mode, 1, 0, None, {}, 0.0, 0.0, role, [{"marker": marker}])

    runs = [run("nospec", BASELINE, "n"), run("fixed:2", ONE_K, "f2"), run("fixed:7", ONE_K, "f7"),
            run("varK:goodput", VARK, "g"), run("nospec", BASELINE, "n2")]
    got = static_traces(runs)
    assert {k: [t[0]["marker"] for t in v] for k, v in got.items()} == {0: ["n", "n2"], 2: ["f2"], 7: ["f7"]}


def test_the_oracle_sees_the_synthetic_proposer_the_run_saw():
    """The synthetic proposer's draws belong to positions, so the oracle's one-token-at-a-time
    pass finds the same matches for every budget: a proposal of 2 there is the proposal of 7 cut
    to 2 (before 27 Nov each call drew from the request's stream, and the oracle's pass, with
    another call pattern than the run's, priced different luck)."""
    from spdflow.api import Request
    from spdflow.oracle import match_lengths
    from spdflow_proposers import SyntheticConfig
    from spdflow_proposers.synthetic import SyntheticProposer

    rng = np.random.default_rng(11)
    outputs = {i: rng.integers(0, 500, 80) for i in range(3)}
    proposer = SyntheticProposer(SyntheticConfig(acceptance_rate=0.6, seed=2), outputs.__getitem__, vocab_size=500)
    requests = [Request(i, "", rng.integers(0, 500, 12), max_new_tokens=80, seed=0) for i in range(3)]
    m, _, calls = match_lengths(get_plugin_manager(), requests, outputs, proposer, [2, 7], ctx_len=256)
    assert calls > 0
    for r in requests:
        two, seven = m[r.index][2], m[r.index][7]
        assert 0 < (seven > 2).sum() and (two == np.minimum(seven, 2))[1:70].all()
