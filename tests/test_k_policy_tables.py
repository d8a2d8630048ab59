"""benchmarks/k_policy_tables.py: the bench command it runs, the table math, the README update."""
from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("k_policy_tables", REPO / "benchmarks" / "k_policy_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _row(mode, batch, tps, role, **extra):
    return {"mode": mode, "batch_size": batch, "tokens_per_s": tps, "tokens_per_s_min": tps - 1,
            "tokens_per_s_max": tps + 1, "role": role, "al": 2.0, "identical_to_nospec": True, **extra}


ROWS = [_row("nospec", 1, 100.0, "baseline"), _row("fixed:2", 1, 150.0, "one_k", fixed_k=2),
        _row("fixed:4", 1, 160.0, "one_k", fixed_k=4), _row("varK:goodput", 1, 156.0, "varK"),
        _row("varK:smallest_covering", 1, 150.0, "varK"),
        _row("nospec", 8, 200.0, "baseline"), _row("fixed:2", 8, 180.0, "one_k", fixed_k=2),
        _row("fixed:4", 8, 150.0, "one_k", fixed_k=4), _row("varK:goodput", 8, 190.0, "varK"),
        _row("varK:smallest_covering", 8, 196.0, "varK")]


def test_bench_command_runs_every_fixed_k_and_each_policy(tables):
    workload = tables.WORKLOADS["stdlib_tests"]
    command = tables.bench_command(workload, ["goodput", "smallest_covering", "guarded"], 3, 24, Path("x.json"))
    assert command[:3] == ["nice", "-n", "-20"]
    assert command[command.index("--modes") + 1] == "nospec,fixed:all,goodput,smallest_covering,guarded"
    assert command[command.index("--batch-sizes") + 1] == "1,2,4,8"
    edit = tables.bench_command(tables.WORKLOADS["edit"], ["goodput"], 3, 8, Path("x.json"), "1,2,4")
    assert edit[edit.index("--batch-sizes") + 1] == "1,2,4" and "recipes/smollm2_chat_varK.yaml" in edit
    assert "workload.builtin=stdlib_tests" in command and "workload.count=24" in command
    assert workload.section == tables.HELD_OUT and tables.WORKLOADS["code"].section == tables.TUNED
    import spdflow_workloads

    held_out = {name for name, w in tables.WORKLOADS.items() if w.section == tables.HELD_OUT}
    assert held_out == set(spdflow_workloads.EVALUATION_ONLY)


def test_set_overrides_reach_every_bench_after_the_workloads_own(tables):
    args = tables.parse_args(["--set", "devices.with.session_mode=dynamic", "--set", "workload.seed=3"])
    assert args.overrides == ["devices.with.session_mode=dynamic", "workload.seed=3"]
    command = tables.bench_command(tables.WORKLOADS["stdlib_tests"], ["goodput"], 3, 24, Path("x.json"),
                                   overrides=args.overrides)
    sets = [command[i + 1] for i, part in enumerate(command) if part == "--set"]
    assert sets[-2:] == ["devices.with.session_mode=dynamic", "workload.seed=3"]
    assert "workload.builtin=stdlib_tests" in sets[:-2]  # the workload's own come first: ours win
    assert tables.parse_args([]).overrides == []


def test_ratios_are_against_the_better_of_nospec_and_the_best_fixed_k(tables):
    lines, reached = tables.batch_table([r for r in ROWS if r["batch_size"] == 1], ["goodput", "smallest_covering"])
    text = "\n".join(lines)
    assert "| fixed K=4 (best fixed) | 160 (159–161) | 1.000 |" in text
    assert "| goodput | 156 (155–157) | 0.975 | reached |" in text
    assert "| smallest_covering | 150 (149–151) | 0.938 | **not reached** |" in text
    assert reached == {"goodput": True, "smallest_covering": False}
    assert "oracle" not in text  # no oracle keys in these rows: no oracle columns
    _, reached = tables.batch_table([r for r in ROWS if r["batch_size"] == 8], ["goodput", "smallest_covering"])
    assert reached == {"goodput": False, "smallest_covering": True}  # no-spec is the better static choice here


def test_oracle_columns_appear_when_the_rows_have_them_and_a_missing_policy_is_no_verdict(tables):
    rows = [dict(r, oracle_tokens_per_s=170.0, oracle_exact=False, policy_efficiency=r["tokens_per_s"] / 170.0,
                 regret_vs_best_static=-0.02) if r["role"] == "varK" else r for r in ROWS if r["batch_size"] == 1]
    lines, reached = tables.batch_table(rows, ["goodput", "guarded"])
    assert "oracle tok/s" in lines[0] and "efficiency" in lines[0] and "regret" in lines[0]
    assert any(line.startswith("| goodput |") and "| 170* | 0.918 | -2.0 % |" in line for line in lines)
    assert reached == {"goodput": True, "guarded": None}
    assert any(line.startswith("| guarded | not in the bench rows") for line in lines)


def test_render_splits_tuned_on_from_held_out_and_updates_the_readme(tables, tmp_path):
    for name in ("code", "thirdparty"):
        (tmp_path / f"{name}.json").write_text(json.dumps(ROWS))
    text = tables.render(tmp_path, ["code", "thirdparty"], ["goodput", "smallest_covering"], {})
    tuned, held = text.index("### Tuned on"), text.index("### Held out")
    assert tuned < text.index("#### code") < held < text.index("#### thirdparty")
    # goodput misses at batch 8, smallest_covering at batch 1; no priced figures in these rows
    assert "| code | 8 | — | 1 | — |" in text
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{tables.README_BEGIN}\nold\n{tables.README_END}\noutro\n")
    tables.update_readme(readme, text)
    updated = readme.read_text()
    assert "old" not in updated and updated.startswith("intro\n") and updated.endswith("outro\n") and "#### code" in updated


def test_the_summary_gives_the_priced_verdict_beside_the_measured_one(tables, tmp_path):
    # Measured, goodput reaches the line at batch 1 (0.975) and misses at 8; priced by the oracle's
    # cost model it misses at batch 1 (regret -5 %) and reaches at 8 (-2 %).
    rows = [dict(r, regret_vs_best_static=-0.05 if r["batch_size"] == 1 else -0.02) if r["mode"] == "varK:goodput"
            else r for r in ROWS]
    (tmp_path / "code.json").write_text(json.dumps(rows))
    text = tables.render(tmp_path, ["code"], ["goodput", "smallest_covering"], {})
    assert "| workload | goodput: below 0.97, measured | goodput: priced |" in text
    assert "| code | 8 | 1 | 1 | — |" in text


def test_unknown_workload_or_policy_exits_2_before_any_bench(tables, capsys, tmp_path):
    assert tables.main(["--workloads", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err
    assert tables.main(["--policies", "no_such_policy", "--out", str(tmp_path)]) == 2
    assert "unknown K policy 'no_such_policy'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_paired_verdict_takes_the_median_of_the_ratios_within_each_repeat(tables, tmp_path):
    # The machine's speed drifts between repeats, so each mode's median rate can come from a
    # different repeat: goodput's median (150, repeat 0) is 6 % below fixed K = 4's (160), but in
    # two of three repeats goodput is within 1.2 % of fixed K = 4 run beside it.
    by_repeat = {"nospec": [100, 100, 60], "fixed:2": [150, 150, 90], "fixed:4": [160, 170, 100],
                 "varK:goodput": [150, 168, 99], "varK:smallest_covering": [140, 150, 95]}
    rows = [dict(r, tokens_per_s=float(sorted(by_repeat[r["mode"]])[1]), tokens_per_s_by_repeat=by_repeat[r["mode"]])
            for r in ROWS if r["batch_size"] == 1]
    lines, reached = tables.batch_table(rows, ["goodput", "smallest_covering"])
    text = "\n".join(lines)
    # (three repeats are too few for a 90 % interval of the median: "—")
    assert "| goodput | 150 (155–157) | 0.938 | **not reached** | 0.988 (0.963–0.989) | reached | — |" in text
    assert reached["goodput"] is False and reached["paired"] == {"goodput": True, "smallest_covering": False}
    assert reached["paired_ci"] == {"goodput": None, "smallest_covering": None}
    (tmp_path / "code.json").write_text(json.dumps(rows))
    text = tables.render(tmp_path, ["code"], ["goodput", "smallest_covering"], {})
    assert ("| workload | goodput: below 0.97, measured | goodput: paired | goodput: paired 90% CI wholly below "
            "| goodput: priced |") in text
    assert "| code | 1 | none | — | — | 1 | 1 | — | — |" in text


def test_the_median_interval_takes_the_order_statistics_that_cover_the_level(tables):
    # 1 - 2 P(Bin(n, 1/2) < j): n = 7 covers 98.4 % with the extremes and 87.5 % with the 2nd
    # values, so at 90 % the interval is the whole range; n = 11 covers 93.5 % from the 3rd value.
    assert tables.median_interval([5, 1, 4, 2, 3, 7, 6]) == (1, 7)
    assert tables.median_interval(list(range(11, 0, -1))) == (3, 9)
    assert tables.median_interval([1, 2, 3, 4]) is None  # the extremes of 4 cover 87.5 %
    assert tables.median_interval([1, 2, 3, 4], level=0.8) == (1, 4)


def test_a_paired_miss_is_settled_only_when_the_whole_interval_is_below_the_line(tables, tmp_path):
    # Eleven repeats. goodput's ratio to fixed K = 4 has a median of 0.96 (a paired miss), but
    # its interval (3rd to 9th value) reaches 0.99: not settled. smallest_covering's ratios all
    # lie at or below 0.95: a settled miss.
    goodput = [0.90, 0.92, 0.94, 0.95, 0.955, 0.96, 0.97, 0.98, 0.99, 1.0, 1.02]
    covering = [0.90, 0.91, 0.92, 0.93, 0.93, 0.94, 0.94, 0.945, 0.95, 0.95, 0.95]
    fixed4 = [160.0] * 11
    by_repeat = {"nospec": [100.0] * 11, "fixed:2": [150.0] * 11, "fixed:4": fixed4,
                 "varK:goodput": [160 * r for r in goodput], "varK:smallest_covering": [160 * r for r in covering]}
    rows = [dict(r, tokens_per_s=statistics.median(by_repeat[r["mode"]]), tokens_per_s_by_repeat=by_repeat[r["mode"]])
            for r in ROWS if r["batch_size"] == 1]
    lines, reached = tables.batch_table(rows, ["goodput", "smallest_covering"])
    assert reached["paired"] == {"goodput": False, "smallest_covering": False}
    assert reached["paired_ci"] == {"goodput": True, "smallest_covering": False}
    assert any(line.startswith("| goodput |") and "| 0.940–0.990 |" in line for line in lines)
    assert any(line.startswith("| smallest_covering |") and "| **0.920–0.950** |" in line for line in lines)
    (tmp_path / "code.json").write_text(json.dumps(rows))
    text = tables.render(tmp_path, ["code"], ["goodput", "smallest_covering"], {})
    assert "| code | 1 | 1 | none | — | 1 | 1 | 1 | — |" in text


def test_the_paired_verdict_refuses_repeats_it_cannot_pair(tables):
    # A mode with a repeat missing cannot be paired by position: no paired figure, not a wrong one.
    rows = [dict(r, tokens_per_s_by_repeat=[r["tokens_per_s"]] * (2 if r["mode"] == "varK:goodput" else 3))
            for r in ROWS if r["batch_size"] == 1]
    lines, reached = tables.batch_table(rows, ["goodput", "smallest_covering"])
    assert reached["paired"] == {"goodput": None, "smallest_covering": False}  # 150 ÷ 160 in every repeat
    assert any(line.startswith("| goodput | 156 (155–157) | 0.975 | reached | — | — |") for line in lines)
