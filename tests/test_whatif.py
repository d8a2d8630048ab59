"""spdflow whatif: replay a recorded run exactly, price it, refuse what it cannot read."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from spdflow.cli import cli
from spdflow.errors import PluginError, RunDataError, TraceVersionError
from spdflow.plugins import get_plugin_manager
from spdflow.testing.fixtures import CODE_PROMPTS, run_in_process, tiny_recipe, write_recipe
from spdflow.whatif import Scenario, load_run, make_cost_model, own_figures, own_scenario, replay

TARGET = "spdflow:tinycode-target"
PROMPT_LOOKUP = {"uses": "prompt_lookup", "with": {"prompt_lookup_min": 1, "prompt_lookup_max": 3}}


def record_run(tmp_path_factory, name: str, **options):
    base = tmp_path_factory.mktemp(name)
    recipe = tiny_recipe(TARGET, base / "run", name=name, prompts=CODE_PROMPTS[:3], max_new_tokens=40, **options)
    pm = get_plugin_manager()
    run_in_process(pm, write_recipe(base / "recipe.yaml", recipe), check_lossless=False)
    return base / "run"


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory):
    return record_run(tmp_path_factory, "greedy", proposer=PROMPT_LOOKUP, k_list=(0, 2, 4, 7))


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory):
    return record_run(tmp_path_factory, "batch", proposer={"uses": "suffix"}, k_list=(0, 1, 3), batch_size=2)


def test_trace_and_outputs_record_what_replay_needs(greedy_run):
    lines = [json.loads(line) for line in (greedy_run / "trace.jsonl").read_text().splitlines()]
    assert lines[0] == {"kind": "header", "trace_version": 2, "spdflow_version": lines[0]["spdflow_version"]}
    rows = [row for r in lines if r["kind"] == "step" for row in r["rows"]]
    assert rows and all({"position", "raw", "proposed", "accepted"} <= set(row) for row in rows)
    assert all(row["proposed"] <= row["raw"] and row["accepted"] <= row["proposed"] for row in rows)
    outputs = [json.loads(line) for line in (greedy_run / "outputs.jsonl").read_text().splitlines()]
    assert all(o["prompt_tokens"] and o["tokens"] for o in outputs)
    grid = json.loads((greedy_run / "cost_grid.json").read_text())
    assert set(grid["entries"][0]["verify_s"]) == {"0", "2", "4", "7"}


@pytest.mark.parametrize("fixture", ["greedy_run", "batch_run"])
def test_replay_of_a_greedy_run_reproduces_its_steps_and_k_usage_exactly(fixture, request):
    run_dir = request.getfixturevalue(fixture)
    pm = get_plugin_manager()
    run = load_run(run_dir, pm)
    prediction = replay(pm, run, own_scenario(run), make_cost_model(pm, run, "measured"))
    measured = own_figures(run)
    assert prediction.identical and prediction.exact
    assert prediction.figures.steps == measured.steps
    assert prediction.figures.k_usage == measured.k_usage
    assert prediction.figures.al == pytest.approx(measured.al)
    assert prediction.figures.generated_tokens == measured.generated_tokens


def test_replay_under_another_k_list_keeps_the_tokens_and_prices_each_step(greedy_run, tmp_path):
    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    table = tmp_path / "costs.yaml"
    table.write_text("source: made up for the test\nverify_ms:\n  1: {0: 1.0, 4: 2.0}\nswitch_ms: {1: 0.5}\n"
                     "prefill_ms: {1: 3.0}\n")
    cost = make_cost_model(pm, run, "table", {"path": str(table)})
    nospec = replay(pm, run, Scenario((0,), "nospec", 1), cost)
    assert nospec.identical and nospec.figures.k_usage == {0: nospec.figures.steps}
    # every decode step of no-spec costs 1 ms, plus one switch after each request's prefill
    assert nospec.figures.verify_s == pytest.approx(nospec.figures.steps * 1e-3 + len(run.requests) * 0.5e-3)
    fixed = replay(pm, run, Scenario((4,), "fixed", 1), cost)
    assert fixed.identical and fixed.figures.steps < nospec.figures.steps
    vark = replay(pm, run, Scenario((0, 4), "smallest_covering", 1), cost)
    events = _shapes_run(pm, run, cost)  # K of each decode run, "prefill" for prefill runs
    decode = [k for k in events if k != "prefill"]
    switches = sum(1 for a, b in zip(events, events[1:]) if b != "prefill" and a != b)  # after a prefill too
    assert 0 < decode.count(4) < len(decode)
    assert vark.figures.verify_s == pytest.approx(sum(1e-3 if k == 0 else 2e-3 for k in decode) + 0.5e-3 * switches)


def _shapes_run(pm, run, cost):
    """The shape of every run of a [0, 4] smallest_covering replay, in order."""
    from spdflow import whatif

    ks = []
    original = whatif.ReplaySession.price

    def spy(self, rows, seq_len, keep):
        ks.append(seq_len - 1 if keep == seq_len else "prefill")
        return original(self, rows, seq_len, keep)

    whatif.ReplaySession.price = spy
    try:
        replay(pm, run, Scenario((0, 4), "smallest_covering", 1), cost)
    finally:
        whatif.ReplaySession.price = original
    return ks


def test_replay_session_answers_with_the_recorded_token_at_each_position(greedy_run):
    from spdflow.whatif import ReplayClock, ReplaySession

    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    cost = make_cost_model(pm, run, "measured")
    session = ReplaySession(run, 1, cost, ReplayClock(), 16, None)
    request = run.requests[0]
    prompt = request.prompt_ids
    ids = np.zeros((1, 16), dtype=np.int64)
    pos = np.full((1, 16), -1, dtype=np.int64)
    n = min(16, len(prompt))
    ids[0, :n], pos[0, :n] = prompt[:n], np.arange(n)
    logits = session.run(ids, pos, 1)
    expected = prompt[n] if n < len(prompt) else run.outputs[0][0]
    assert int(np.argmax(logits[0, 0])) == int(expected)


def test_whatif_refuses_a_trace_of_an_unknown_version(greedy_run, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(greedy_run, copy)
    trace = copy / "trace.jsonl"
    lines = trace.read_text().splitlines()
    lines[0] = json.dumps({"kind": "header", "trace_version": 99})
    trace.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceVersionError, match="trace format version 99"):
        load_run(copy, get_plugin_manager())
    result = CliRunner().invoke(cli, ["whatif", str(copy)])
    assert result.exit_code == 1
    assert "trace format version 99, which this spdflow" in result.output


def test_whatif_refuses_a_trace_without_replayable_fields(greedy_run, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(greedy_run, copy)
    trace = copy / "trace.jsonl"
    trace.write_text("\n".join(trace.read_text().splitlines()[1:]) + "\n")  # no header: version 1
    with pytest.raises(TraceVersionError, match="written before replayable traces"):
        load_run(copy, get_plugin_manager())


def test_whatif_says_what_is_missing_in_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(RunDataError, match="not a finished spdflow run"):
        load_run(tmp_path, get_plugin_manager())


def test_whatif_cli_prints_the_run_beside_the_prediction_and_json(greedy_run):
    result = CliRunner().invoke(cli, ["whatif", str(greedy_run), "--k-list", "0,4", "--policy", "smallest_covering"])
    assert result.exit_code == 0, result.output
    assert "run (measured)" in result.output and "| predicted | [0, 4] | smallest_covering | 1 |" in result.output
    assert "cost model: measured" in result.output
    result = CliRunner().invoke(cli, ["whatif", str(greedy_run), "--json", "--batch-size", "1"])
    data = json.loads(result.output)
    assert data["predictions"][0]["steps"] == data["run"]["steps"]


def test_whatif_rejects_a_bad_cost_setting_with_one_sentence(greedy_run):
    result = CliRunner().invoke(cli, ["whatif", str(greedy_run), "--cost", "table", "--cost-with", "nope=1"])
    assert result.exit_code == 2 and "--cost-with" in result.output


# ------------------------------------------------------------------------------ advise


def test_candidate_lists_hold_every_small_list_with_a_positive_k():
    from spdflow.advise import candidate_lists

    lists = candidate_lists(3, 2)
    assert (0,) not in lists and (3,) in lists and (0, 3) in lists and (1, 2) in lists
    assert len(lists) == 3 + 6 and all(len(ks) <= 2 for ks in lists)


def test_advise_ranks_lists_by_predicted_throughput_and_prints_recipe_lines(greedy_run, tmp_path):
    table = tmp_path / "costs.yaml"
    # verify cost grows steeply with K: long lists must not win by default
    table.write_text("verify_ms:\n  1: {0: 1.0, 1: 1.1, 2: 1.3, 3: 2.5}\nswitch_ms: {1: 0.05}\n")
    result = CliRunner().invoke(cli, ["advise", str(greedy_run), "--max-shapes", "2", "--k-max", "3", "--cost", "table",
                                      "--cost-with", f"path={table}", "--json", "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    ranked = data["ranked"]
    scores = [r["score"] for r in ranked]
    assert scores == sorted(scores, reverse=True)
    best = ranked[0]
    assert best["recipe"] == f"num_speculative_tokens: {best['k_list']}\nk_policy: {best['policy']}"
    nospec = data["nospec"][0]["tokens_per_s"]
    assert best["cells"][0]["tokens_per_s"] == pytest.approx(best["speedup_vs_nospec"] * nospec)
    text = CliRunner().invoke(cli, ["advise", str(greedy_run), "--max-shapes", "1", "--k-max", "2", "--cost", "table",
                                    "--cost-with", f"path={table}", "-q"]).output
    assert "recipe lines for the best list:" in text and "best fixed K: b1 K=" in text


# ------------------------------------------------------------------------------ cost models


def test_table_cost_model_interpolates_k_and_names_the_file_when_it_cannot_price(tmp_path):
    from spdflow_costs.table import TableConfig, TableCost

    path = tmp_path / "t.yaml"
    path.write_text("verify_ms:\n  2: {0: 1.0, 4: 3.0}\n")
    cost = TableCost(TableConfig(path=str(path)))
    assert cost.verify_s(2, 2) == pytest.approx(2e-3) and cost.switch_s(2) == 0.0
    with pytest.raises(RunDataError, match="cannot price K=7 at batch 2"):
        cost.verify_s(2, 7)
    with pytest.raises(RunDataError, match="has no verify_ms for batch 1"):
        cost.verify_s(1, 0)


def test_roofline_prices_bytes_and_flops_with_mx_formats():
    from spdflow_costs.roofline import BYTES, RooflineConfig, RooflineCost, load_shape

    assert BYTES["mxfp6"] == pytest.approx(0.78125) and BYTES["mxint8"] == pytest.approx(1.03125)
    shape = load_shape("llama-3.1-8b", None)
    assert shape.linear_weights() == pytest.approx(7.5047e9, rel=1e-4)
    cost = RooflineCost(RooflineConfig(profile="ai100-ultra", model="llama-3.1-8b", ctx_len=2048, overhead_ms=0.0))
    weights = shape.linear_weights() * 0.78125
    kv = 32 * 2 * 8 * 128 * 2048 * 1.03125
    assert cost.verify_s(1, 0) == pytest.approx((weights + kv) / 548e9)  # memory-bound
    compute_bound = RooflineCost(RooflineConfig(profile="ai100-ultra", model="llama-3.1-8b", ctx_len=2048,
                                                overhead_ms=0.0, weights="float32"))
    assert compute_bound.verify_s(1, 0) > cost.verify_s(1, 0)
    # the shipped Ultra profile's overhead reproduces the no-spec TPOT it was fitted on
    fitted = RooflineCost(RooflineConfig(profile="ai100-ultra", model="llama-3.1-8b", ctx_len=2048))
    assert fitted.verify_s(1, 0) == pytest.approx(0.034, abs=1e-4)


def test_a_cost_model_that_includes_the_host_leaves_only_priced_time(greedy_run):
    from spdflow_costs.roofline import RooflineConfig, RooflineCost

    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    cost = RooflineCost(RooflineConfig(profile="ai100-ultra", model="llama-3.1-8b", ctx_len=2048))
    assert cost.includes_host
    p = replay(pm, run, Scenario((0,), "nospec", 1), cost)
    f = p.figures
    assert f.host_s == 0.0 and f.propose_s == 0.0
    assert f.verify_s == pytest.approx(f.steps * cost.verify_s(1, 0))
    assert any("prices whole steps" in n for n in p.notes)


@pytest.mark.parametrize("proposer", ["multi_projection", "eagle"])
def test_whatif_refuses_a_proposer_that_reads_the_target_outputs(greedy_run, proposer):
    import dataclasses

    from spdflow.errors import UsageError
    from spdflow.recipe.schema import ProposerSpec

    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    recipe = run.recipe.model_copy(update={"proposer": ProposerSpec(uses=proposer)})
    run = dataclasses.replace(run, loaded=dataclasses.replace(run.loaded, recipe=recipe))
    cost = make_cost_model(pm, run, "measured")
    with pytest.raises(UsageError, match=f"cannot replay proposer '{proposer}': it proposes from the target's"):
        replay(pm, run, own_scenario(run), cost)
    nospec = replay(pm, run, Scenario((0,), "nospec", 1), cost)  # K = 0 needs no proposer
    assert nospec.identical


def test_in_situ_reads_the_runs_own_verify_medians_host_and_gap():
    from spdflow.costs import in_situ

    steps = [{"kind": "step", "k": k, "batch": 2, "verify_s": v, "host_s": h, "propose_s": p}
             for k, v, h, p in [(0, 1.0, 0.1, 0.0), (0, 4.0, 0.3, 0.0), (4, 5.0, 0.2, 0.1), (0, 1.0, 0.2, 0.1)]]
    own = in_situ([{"kind": "header"}, {"kind": "prefill"}, *steps])
    assert own.batch == 2 and own.verify_s == {0: 2.0, 4: 5.0} and own.steps == {0: 3, 4: 1}  # means
    assert own.after_change == {0: 3, 4: 1}  # every step is within 4 of the prefill or a change
    assert own.host_per_step_s == pytest.approx(0.2) and own.gap_s == pytest.approx(0.3)  # median of .1 .3 .3 .3
    assert in_situ([{"kind": "header"}]) is None


def test_measured_prices_the_runs_own_batch_from_its_steps_and_other_shapes_from_the_grid(greedy_run):
    from spdflow.costs import in_situ

    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    own = in_situ(run.records)
    cost = make_cost_model(pm, run, "measured")
    often = [k for k, n in own.steps.items() if n >= 5]
    assert often, own.steps
    for k in often:  # the run's own batch: its own mean, not the grid's
        assert cost.verify_s(own.batch, k) == own.verify_s[k]
    assert cost.host_per_step_s == own.host_per_step_s
    grid_only = make_cost_model(pm, run, "measured", {"in_situ": False})
    assert grid_only.host_per_step_s is None
    assert grid_only.verify_s(own.batch, often[0]) == grid_only.grid[own.batch].verify_s[often[0]]
    # a replay with in_situ charges the run's host time per step
    prediction = replay(pm, run, own_scenario(run), cost)
    assert prediction.figures.host_s == pytest.approx(prediction.figures.steps * own.host_per_step_s)
    assert any("host time: the run's own" in n for n in prediction.notes)


def test_measured_prices_a_k_the_run_barely_ran_at_the_runs_level_not_the_grids(greedy_run):
    """A K the run verified fewer than 5 times is priced from the grid, scaled by the median ratio of
    the run's own times to the grid's: unscaled, a grid 0.64x the run's level priced such a K far
    too cheap beside the run's own Ks (benchmarks/results/k_policy_r26_tried/rules.md, F1)."""
    import dataclasses as dc

    from spdflow.costs import GridEntry, InSitu

    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    cost = make_cost_model(pm, run, "measured")
    batch = cost.own.batch
    cost.grid[batch] = GridEntry(batch, {0: 1.0e-3, 2: 1.2e-3, 4: 1.5e-3, 7: 2.0e-3}, 0.4e-3, None, 0, 3, "", [])
    cost.own = InSitu(batch, {0: 1.5e-3, 2: 2.0e-3, 4: 9.0e-3, 7: 3.0e-3}, {0: 40, 2: 3, 4: 2, 7: 30}, 1e-4, 2e-4)
    cost._scale = None
    # the run's own figures where it ran a K at least 5 times; ratios to the grid 1.5 and 1.5
    assert cost.verify_s(batch, 0) == 1.5e-3 and cost.verify_s(batch, 7) == 3.0e-3
    assert cost.scale(batch) == pytest.approx(1.5)
    # K = 2 and 4 ran 3 and 2 times: the grid at the run's level, not their few steps' means
    assert cost.verify_s(batch, 2) == pytest.approx(1.8e-3) and cost.verify_s(batch, 4) == pytest.approx(2.25e-3)
    assert cost.switch_s(batch) == pytest.approx(0.6e-3)
    assert cost.describe()["in_situ"]["grid_scale"] == 1.5
    # other batch sizes are the grid's own figures
    other = batch + 1
    cost.grid[other] = dc.replace(cost.grid[batch], batch=other)
    assert cost.verify_s(other, 4) == 1.5e-3 and cost.switch_s(other) == 0.4e-3
    # without in_situ, the grid alone
    grid_only = make_cost_model(pm, run, "measured", {"in_situ": False})
    assert grid_only.scale(batch) == 1.0


def test_measured_cautions_where_a_k_s_own_price_is_mostly_steps_after_a_change(greedy_run):
    """A K held in short spells is priced at its slow steps after a change, and the switch is charged
    on top (benchmarks/results/k_policy_r28_tried/rules.md, F5): the prediction says so."""
    from spdflow.costs import AFTER_CHANGE, in_situ
    from spdflow.whatif import replay

    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    cost = make_cost_model(pm, run, "measured")
    batch = cost.own.batch
    step = {"kind": "step", "batch": batch, "host_s": 0.0, "propose_s": 0.0}
    spells = ([{"kind": "prefill"}] + [{**step, "k": 7, "verify_s": 2e-3}] * 12
              + [{**step, "k": 0, "verify_s": 1.6e-3}] * 2) * 4
    cost.own = in_situ(spells)  # K = 0: 8 steps, all within AFTER_CHANGE of a change; K = 7: 48, 4 x AFTER_CHANGE
    assert cost.own.steps == {7: 48, 0: 8} and cost.own.after_change == {7: 4 * AFTER_CHANGE, 0: 8}
    cautions = cost.cautions(batch)
    assert len(cautions) == 1 and cautions[0].startswith("K=0 is priced at the run's own mean over 8 steps, 8 of them")
    assert cost.cautions(batch + 1) == []  # other batch sizes come from the grid
    prediction = replay(pm, run, own_scenario(run), cost)
    assert cautions[0] in prediction.notes
    assert make_cost_model(pm, run, "measured", {"in_situ": False}).cautions(batch) == []
    cost.cautions = lambda batch: "K=0 looks dear"  # a plugin's slip: not a list of sentences
    with pytest.raises(PluginError, match=rf"returned str from cautions\({batch}\); it must return a list of sentences"):
        replay(pm, run, own_scenario(run), cost)


def test_charge_host_moves_wall_and_rates_with_the_host_time():
    from spdflow.whatif import Figures, charge_host

    figures = Figures(100.0, 200.0, 10, {0: 10}, 1.0, 1.0, 0.5, 0.0, 0.01, 0.2, 100)
    charged = charge_host(figures, 0.011)  # 10 steps x 11 ms = 0.11 s of host instead of 0.01 s
    assert charged.host_s == pytest.approx(0.11) and charged.wall_s == pytest.approx(1.1)
    assert charged.tokens_per_s == pytest.approx(100 / 1.1)
    assert charged.decode_tokens_per_s == pytest.approx(100 / (0.5 + 0.1))


def test_a_cost_model_that_prices_host_and_proposer_makes_replays_repeatable(greedy_run):
    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    cost = make_cost_model(pm, run, "measured")
    cost.propose_per_call_s = 0.004
    calls = sum(1 for r in run.records if r.get("kind") == "step" and r["propose_s"] > 0)
    assert calls
    first, second = (replay(pm, run, own_scenario(run), cost) for _ in range(2))
    for prediction in (first, second):
        assert prediction.figures.propose_s == pytest.approx(calls * 0.004)
    # host and proposer both charged: nothing real is left, and two replays agree exactly
    assert first.figures.host_s == pytest.approx(first.figures.steps * cost.host_per_step_s)
    assert first.figures.tokens_per_s == second.figures.tokens_per_s
    assert any("proposer time: 4.000 ms per call" in n for n in first.notes)


def test_grid_timing_keeps_the_host_busy_for_the_gap_after_each_run():
    import time

    from spdflow.costs import _time_runs

    class Hook:
        def spdflow_verify(self, **kwargs):
            return None

    class PM:
        hook = Hook()

    start = time.perf_counter()
    times = _time_runs(PM(), None, [(1, 1, 1)] * 5, 0, None, gap_s=0.01)
    assert time.perf_counter() - start >= 0.05 and len(times) == 5 and max(times) < 0.01
