"""spdflow bench: row shape, interleaving, losslessness, and the table math."""
from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from spdflow import bench
from spdflow.bench import BenchOptions, add_deltas, bench_recipe, markdown_table, run_order, summarize
from spdflow.cli import cli
from spdflow.api import KPolicy
from spdflow.recipe.loader import load_recipe

RECIPE = """\
version: 1
name: bench-tiny
model:
  id: {model}
proposer:
  uses: prompt_lookup
  with: {{prompt_lookup_min: 1, prompt_lookup_max: 2}}
num_speculative_tokens: [2, 4]
specialization: {{prefill_seq_len: 16, ctx_len: 64, batch_size: 1}}
devices: {{backend: onnxruntime, with: {{threads: 1}}}}
workload:
  prompts: ["def add(a, b):\\n    return a + b\\n\\ndef add(", "x = x + 1\\nx = x + 1\\nx = x"]
  max_new_tokens: 6
output: {output}
"""


MINIMAL_SPD = """\
version: 1
name: modes
model: {id: x}
proposer: {uses: prompt_lookup}
num_speculative_tokens: [2, 4]
k_policy: goodput
"""


@pytest.fixture(scope="module")
def tiny_recipe(tmp_path_factory):
    from spdflow.testing.models import make_tiny_model

    root = tmp_path_factory.mktemp("bench")
    model = make_tiny_model(root / "model")
    path = root / "recipe.yaml"
    path.write_text(RECIPE.format(model=model, output=root / "runs"))
    return path


@pytest.fixture(scope="module")
def tiny_rows(tiny_recipe):
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    loaded = load_recipe(tiny_recipe, pm, allow_outside_paths=True)
    order = []
    original = bench.BatchBench.run

    def recording(self, mode, repeat):
        order.append((self.batch_size, repeat, mode.row))
        return original(self, mode, repeat)

    bench.BatchBench.run = recording
    try:
        rows = bench_recipe(pm, loaded, BenchOptions(batch_sizes=[1, 2], repeats=2))
    finally:
        bench.BatchBench.run = original
    return rows, order


def test_bench_rows_have_the_documented_keys(tiny_rows):
    rows, _ = tiny_rows
    # the recipe's policy is smallest_covering (the default), so varK and smallest_covering are one row
    assert {(r["batch_size"], r["mode"]) for r in rows} == {
        (b, m) for b in (1, 2) for m in ("nospec", "fixed", "varK:smallest_covering")}
    assert {r["policy"] for r in rows} == {"nospec", "fixed", "smallest_covering"}
    for row in rows:
        assert set(bench.ROW_KEYS) <= set(row)
        for key in ("requests_per_s", "tokens_per_s", "tpot_ms", "peak_rss_mb"):
            assert row[f"{key}_min"] <= row[key] <= row[f"{key}_max"]


def test_bench_policy_rows_carry_the_oracle_priced_by_one_cost_model(tiny_rows):
    rows, _ = tiny_rows
    for row in rows:
        if row["role"] != "varK":
            assert row.get("oracle_tokens_per_s") is None
            continue
        detail = row["oracle_detail"]
        static = [detail["nospec_priced_tokens_per_s"], *detail["fixed_priced_tokens_per_s"].values()]
        assert set(detail["fixed_priced_tokens_per_s"]) == {"2", "4"}  # the K-list [2, 4], plus no-spec
        # the oracle weighs every static choice, priced alike, and is never slower than one
        assert row["oracle_tokens_per_s"] >= max(static) * (1 - 1e-9)
        assert detail["best_static_tokens_per_s"] == pytest.approx(max(static))
        assert sum(detail["oracle_k_usage"].values()) == detail["oracle_steps"] > 0
        assert row["oracle_exact"] == detail["oracle_exact"]
        assert detail["oracle"] == ("oracle" if row["oracle_exact"] else "oracle (best found, beam 64)")
        assert 0 < row["policy_priced_tokens_per_s"]
        # one oracle per batch size, so the median ratio is the ratio of the medians
        assert row["policy_efficiency"] == pytest.approx(row["policy_priced_tokens_per_s"] / row["oracle_tokens_per_s"])
        assert row["regret_vs_best_static"] == pytest.approx(row["policy_priced_tokens_per_s"] / max(static) - 1)
        if row["batch_size"] == 1:
            assert row["oracle_exact"] and row["policy_efficiency"] <= 1 + 1e-9
    text = markdown_table(rows)
    assert "| oracle tok/s | policy eff. | regret |" in text


def test_bench_greedy_modes_are_identical_to_nospec(tiny_rows):
    rows, _ = tiny_rows
    assert all(row["identical_to_nospec"] is True for row in rows)
    assert all(row["al"] == pytest.approx(1.0) for row in rows if row["mode"] == "nospec")


def test_bench_interleaves_modes_across_repeats(tiny_rows):
    _, order = tiny_rows
    at_one = [(r, m) for b, r, m in order if b == 1]
    varK = "varK:smallest_covering"
    assert at_one == [(0, "nospec"), (0, "fixed"), (0, varK), (1, "fixed"), (1, varK), (1, "nospec")]


def test_run_order_rotates_the_first_mode():
    order = run_order(["a", "b", "c"], 3)
    firsts = [order[i][1] for i in (0, 3, 6)]
    assert firsts == ["a", "b", "c"]
    assert sorted(order) == sorted((r, m) for r in range(3) for m in "abc")


def test_deltas_are_ratios_against_nospec_and_fixed():
    # the partners are found by role, so a third-party policy with the same role stands in
    rows = [{"batch_size": 1, "mode": "my_nospec", "role": "baseline", "tokens_per_s": 100.0},
            {"batch_size": 1, "mode": "fixed", "role": "one_k", "tokens_per_s": 150.0},
            {"batch_size": 1, "mode": "varK:goodput", "role": "varK", "tokens_per_s": 180.0},
            {"batch_size": 2, "mode": "varK:goodput", "role": "varK", "tokens_per_s": 50.0}]
    add_deltas(rows)
    assert rows[0]["delta_vs_nospec"] == pytest.approx(0.0)
    assert rows[1]["delta_vs_nospec"] == pytest.approx(0.5)
    assert rows[2]["delta_vs_nospec"] == pytest.approx(0.8)
    assert rows[2]["varK_vs_fixed"] == pytest.approx(0.2)
    assert rows[1]["varK_vs_fixed"] is None
    assert rows[3]["delta_vs_nospec"] is None and rows[3]["varK_vs_fixed"] is None


def test_table_renders_deltas_as_signed_percentages():
    rows = add_deltas([{"batch_size": 1, "mode": "nospec", "role": "baseline", "tokens_per_s": 100.0},
                       {"batch_size": 1, "mode": "varK:goodput", "role": "varK", "tokens_per_s": 90.0,
                        "identical_to_nospec": False}])
    text = markdown_table(rows)
    assert "-10.0%" in text and "+0.0%" in text and "NO" in text


def _run(mode, batch, repeat, tps, tokens):
    from spdflow.bench import ModeRun
    from spdflow.report.metrics import compute_metrics

    wall = 10 / tps
    records = [{"kind": "request", "request": 0, "prompt_tokens": 3, "generated_tokens": 10, "ttft_s": 0.0,
                "finish_s": wall, "stop_reason": "max_new_tokens"}]
    return ModeRun(mode, batch, repeat, compute_metrics(records), {0: tokens}, 100.0, 1.0)


def test_summarize_takes_median_min_max_and_checks_identity():
    runs = [_run("varK:goodput", 1, r, tps, [1, 2]) for r, tps in reversed(list(enumerate((10.0, 30.0, 20.0))))]
    runs.append(_run("fixed", 1, 0, 5.0, [1, 3]))
    rows = {r["mode"]: r for r in summarize(runs, {0: [1, 2]})}
    assert rows["varK:goodput"]["tokens_per_s"] == pytest.approx(20.0)
    assert rows["varK:goodput"]["tokens_per_s_by_repeat"] == pytest.approx([10.0, 30.0, 20.0])  # repeat order
    assert (rows["varK:goodput"]["tokens_per_s_min"], rows["varK:goodput"]["tokens_per_s_max"]) == pytest.approx((10.0, 30.0))
    assert rows["varK:goodput"]["identical_to_nospec"] is True and rows["varK:goodput"]["policy"] == "goodput"
    assert rows["fixed"]["identical_to_nospec"] is False


def _steps_run(mode, repeat, accepted_per_step, ks):
    """A run whose decode steps accepted ``accepted_per_step`` proposals at the chosen ``ks``."""
    from spdflow.bench import ModeRun
    from spdflow.report.metrics import compute_metrics

    records = [{"kind": "request", "request": 0, "prompt_tokens": 3, "generated_tokens": 10, "ttft_s": 0.0,
                "finish_s": 1.0, "stop_reason": "max_new_tokens"}]
    records += [{"kind": "step", "step": i, "t": 0.1 * i, "k": k, "batch": 1, "verify_s": 0.01, "propose_s": 0.0,
                 "host_s": 0.0, "rows": [{"request": 0, "slot": 0, "position": 3 + i, "raw": k, "proposed": k,
                                          "accepted": a, "emitted": a + 1}]}
                for i, (a, k) in enumerate(zip(accepted_per_step, ks))]
    return ModeRun(mode, 1, repeat, compute_metrics(records), {0: [1]}, 100.0, 1.0)


def test_acceptance_length_rate_and_k_histogram_are_medians_over_repeats():
    runs = [_steps_run("varK:goodput", 0, [0, 0], [2, 2]),      # AL 1.0, K=2 twice
            _steps_run("varK:goodput", 1, [2, 2], [2, 4]),      # AL 3.0
            _steps_run("varK:goodput", 2, [1, 1, 1], [4, 4, 4])]  # AL 2.0, K=4 three times
    row = summarize(runs, None)[0]
    assert [r.metrics.mean_acceptance_length for r in runs] == pytest.approx([1.0, 3.0, 2.0])
    assert row["al"] == pytest.approx(2.0)  # the median, not the first repeat's 1.0
    rates = sorted(r.metrics.draft_acceptance_rate for r in runs)
    assert row["acceptance_rate"] == pytest.approx(rates[1])
    assert row["k_histogram"] == {"2": 1, "4": 1}  # K=2: 2, 1, 0 -> 1; K=4: 0, 1, 3 -> 1


def test_modes_resolve_to_policy_named_rows_and_unknown_names_fail(pm, write_recipe):
    from spdflow.bench import resolve_modes
    from spdflow.errors import UsageError

    recipe = load_recipe(write_recipe(MINIMAL_SPD), pm).recipe
    modes = resolve_modes(pm, ["nospec", "fixed", "varK", "smallest_covering"], recipe)
    assert [(m.row, m.policy, m.role, m.speculates) for m in modes] == [
        ("nospec", "nospec", "baseline", False), ("fixed", "fixed", "one_k", True),
        ("varK:goodput", "goodput", "varK", True), ("varK:smallest_covering", "smallest_covering", "varK", True)]
    assert [m.row for m in resolve_modes(pm, ["varK", "goodput", "varK:goodput"], recipe)] == ["varK:goodput"]
    with pytest.raises(UsageError, match="unknown bench mode 'turbo'"):
        resolve_modes(pm, ["turbo"], recipe)


class _EveryOther(KPolicy):
    """A third-party varK policy; and two that behave like nospec and fixed under other names."""

    def choose_k(self, proposal_counts, compiled_ks):
        return max(compiled_ks)


class _Zero(_EveryOther):
    def required_ks(self, compiled_ks):
        return [0]


class _Two(_EveryOther):
    def required_ks(self, compiled_ks):
        return [2]


def test_a_third_party_policy_gets_its_row_and_role_from_what_it_needs(pm, write_recipe):
    from spdflow.bench import resolve_modes
    from spdflow.hookspecs import hookimpl

    class Policies:
        @hookimpl
        def spdflow_register_k_policies(self, register):
            register("skip_all", _Zero)
            register("always_two", _Two)
            register("every_other", _EveryOther)

    pm.add_plugin(Policies(), "third_party")
    recipe = load_recipe(write_recipe(MINIMAL_SPD), pm).recipe
    rows = add_deltas([{"batch_size": 1, "mode": m.row, "role": m.role, "tokens_per_s": tps}
                       for m, tps in zip(resolve_modes(pm, ["skip_all", "always_two", "every_other"], recipe),
                                         (100.0, 120.0, 150.0))])
    assert [(r["mode"], r["role"]) for r in rows] == [("skip_all", "baseline"), ("always_two", "one_k"),
                                                      ("varK:every_other", "varK")]
    assert rows[2]["delta_vs_nospec"] == pytest.approx(0.5) and rows[2]["varK_vs_fixed"] == pytest.approx(0.25)


def test_bench_cli_writes_json_and_rejects_unknown_mode(tiny_recipe, tmp_path):
    out = tmp_path / "rows.json"
    result = CliRunner().invoke(cli, ["bench", str(tiny_recipe), "--repeats", "1", "--modes", "nospec,varK,goodput",
                                      "--json", str(out), "--markdown", "-q"])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["mode"] for r in rows] == ["nospec", "varK:goodput", "varK:smallest_covering"]
    assert all(r["identical_to_nospec"] for r in rows)
    assert "| batch |" in result.stdout and "oracle tok/s" in result.stdout
    assert all(r.get("policy_efficiency") is not None for r in rows if r["mode"].startswith("varK:"))
    skipped = CliRunner().invoke(cli, ["bench", str(tiny_recipe), "--repeats", "1", "--modes", "varK", "--no-oracle",
                                       "--json", str(out), "-q"])
    assert skipped.exit_code == 0, skipped.output
    assert all(r.get("oracle_tokens_per_s") is None for r in json.loads(out.read_text()))
    bad = CliRunner().invoke(cli, ["bench", str(tiny_recipe), "--modes", "nospec,turbo"])
    assert bad.exit_code == 2
    assert "unknown bench mode 'turbo'" in bad.output


# ------------------------------------------------------------------------------ fixed:<K>


def test_fixed_k_modes_pin_each_k_of_the_list_and_other_ks_fail(pm, write_recipe):
    from spdflow.bench import mode_policy, resolve_modes
    from spdflow.errors import UsageError

    recipe = load_recipe(write_recipe(MINIMAL_SPD.replace("[2, 4]", "[0, 2, 4, 7]")), pm).recipe
    modes = resolve_modes(pm, ["nospec", "fixed:4", "fixed:all", "varK"], recipe)
    assert [(m.row, m.role, m.k) for m in modes] == [
        ("nospec", "baseline", None), ("fixed:4", "one_k", 4), ("fixed:2", "one_k", 2), ("fixed:7", "one_k", 7),
        ("varK:goodput", "varK", None)]
    policy = mode_policy(pm, modes[1], recipe)
    assert policy.required_ks([0, 2, 4, 7]) == [4] and policy.choose_k([0, 7], [0, 2, 4, 7]) == 4
    for bad in ("fixed:3", "fixed:0", "fixed:x", "fixed:"):
        with pytest.raises(UsageError, match=f"bench mode '{bad}' names no K > 0 of the recipe's K-list"
                                             r" \[0, 2, 4, 7\]") as error:
            resolve_modes(pm, [bad], recipe)
        assert "fixed:2, fixed:4, fixed:7, fixed:all" in str(error.value.hint)


def test_varK_is_compared_with_the_largest_fixed_k():
    rows = add_deltas([{"batch_size": 1, "mode": "fixed:2", "role": "one_k", "fixed_k": 2, "tokens_per_s": 150.0},
                       {"batch_size": 1, "mode": "fixed:4", "role": "one_k", "fixed_k": 4, "tokens_per_s": 120.0},
                       {"batch_size": 1, "mode": "varK:goodput", "role": "varK", "tokens_per_s": 180.0}])
    assert rows[2]["varK_vs_fixed"] == pytest.approx(0.5)


def test_bench_cli_runs_fixed_all_losslessly_and_records_the_prompts_digest(tiny_recipe, tmp_path):
    from spdflow.workload import prompts_digest

    out = tmp_path / "rows.json"
    result = CliRunner().invoke(cli, ["bench", str(tiny_recipe), "--repeats", "1", "--modes", "nospec,fixed:all",
                                      "--json", str(out), "--markdown", "-q"])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [(r["mode"], r.get("fixed_k")) for r in rows] == [("nospec", None), ("fixed:2", 2), ("fixed:4", 4)]
    assert all(r["identical_to_nospec"] for r in rows)
    for row in rows[1:]:
        assert set(row["k_histogram"]) == {str(row["fixed_k"])}
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(", "x = x + 1\nx = x + 1\nx = x"]
    assert {r["prompts_sha256"] for r in rows} == {prompts_digest(prompts)}
    bad = CliRunner().invoke(cli, ["bench", str(tiny_recipe), "--modes", "nospec,fixed:3"])
    assert bad.exit_code == 2
    assert "bench mode 'fixed:3' names no K > 0 of the recipe's K-list [0, 2, 4]" in bad.output
