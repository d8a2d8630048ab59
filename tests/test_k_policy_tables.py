"""benchmarks/k_policy_tables.py: the bench command it runs, the table math, the README update."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def tables():
    return load_benchmark("k_policy_tables")


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


# ------------------------------------------------------------------------------ several processes

# Two processes of one bench at batch 1; the machine is faster in the second. Within each
# process goodput runs at a fixed share of fixed K = 4 in the same repeat (0.95, 0.96, 0.97 in the
# first; 0.99, 1.0, 0.985 in the second), while fixed K = 4 itself moves from repeat to repeat, so
# a pairing across processes or of sorted lists would give other ratios.
FIXED4 = ([150.0, 160.0, 170.0], [210.0, 200.0, 190.0])
SHARES = ([0.95, 0.96, 0.97], [0.99, 1.0, 0.985])


def _process(p, digest="ab" * 32, **goodput):
    by_repeat = {"nospec": [100.0] * 3, "fixed:2": [140.0] * 3 if p == 0 else [170.0] * 3, "fixed:4": FIXED4[p],
                 "varK:goodput": [f * s for f, s in zip(FIXED4[p], SHARES[p])],
                 "varK:smallest_covering": [f * 0.9 for f in FIXED4[p]]}
    rows = [dict(r, tokens_per_s=statistics.median(by_repeat[r["mode"]]), tokens_per_s_by_repeat=by_repeat[r["mode"]],
                 repeats=3, prompts_sha256=digest) for r in ROWS if r["batch_size"] == 1]
    return [dict(r, **goodput) if r["mode"] == "varK:goodput" else r for r in rows]


def _mode(rows, mode):
    return next(r for r in rows if r["mode"] == mode)


def test_pooled_processes_concatenate_repeats_and_pair_them_within_each_process(tables):
    first = _process(0, al=2.0, oracle_tokens_per_s=170.0, regret_vs_best_static=-0.01, oracle_exact=True)
    second = _process(1, al=3.0, oracle_tokens_per_s=230.0, regret_vs_best_static=-0.05, oracle_exact=False,
                      identical_to_nospec=False)
    pooled = tables.pool_rows([first, second])
    goodput, fixed4 = _mode(pooled, "varK:goodput"), _mode(pooled, "fixed:4")
    repeats = _mode(first, "varK:goodput")["tokens_per_s_by_repeat"] + _mode(second, "varK:goodput")["tokens_per_s_by_repeat"]
    assert goodput["tokens_per_s_by_repeat"] == repeats  # in process order
    assert goodput["tokens_per_s"] == statistics.median(repeats)
    assert (goodput["tokens_per_s_min"], goodput["tokens_per_s_max"]) == (min(repeats), max(repeats))
    assert goodput["repeats"] == 6 and goodput["processes"] == 2
    assert fixed4["tokens_per_s"] == 180.0 and fixed4["fixed_k"] == 4 and isinstance(fixed4["fixed_k"], int)
    # per-process estimates: their median; a claim every process must make: False when one says False
    assert goodput["al"] == 2.5 and goodput["oracle_tokens_per_s"] == 200.0
    assert goodput["regret_vs_best_static"] == pytest.approx(-0.03)
    assert goodput["identical_to_nospec"] is False and goodput["oracle_exact"] is False
    assert fixed4["identical_to_nospec"] is True
    assert tables.merge_values("tpot_ms_min", [2.0, 1.0, 3.0]) == 1.0  # the spread of every process
    assert tables.merge_values("tpot_ms_max", [2.0, 1.0, 3.0]) == 3.0
    ratios = tables.paired_ratios(goodput, tables.reference_row([r for r in pooled if r["batch_size"] == 1]))
    assert ratios == pytest.approx([0.95, 0.96, 0.97, 0.99, 1.0, 0.985])
    assert goodput["paired_by_process"] == pytest.approx([0.96, 0.99])
    lines, reached = tables.batch_table(pooled, ["goodput", "smallest_covering"])
    assert "paired per process" in lines[0]
    assert any(line.startswith("| goodput |") and "| 0.978 (0.963–0.989) | reached | 0.950–1.000 | 0.960, 0.990 | 2.50 |" in line
               for line in lines)
    assert any(line.startswith("| fixed K=4 (best fixed) |") and "| — | 2.00 |" in line for line in lines)
    assert reached["paired"] == {"goodput": True, "smallest_covering": False}
    single, _ = tables.batch_table(first, ["goodput"])
    assert "paired per process" not in single[0]  # one bench's rows: no such column


def test_a_process_without_a_mode_or_with_other_repeat_counts_is_not_paired_across(tables):
    second = [r for r in _process(1) if r["mode"] != "varK:goodput"]
    goodput = _mode(tables.pool_rows([_process(0), second]), "varK:goodput")
    assert goodput["tokens_per_s_by_repeat"] == _mode(_process(0), "varK:goodput")["tokens_per_s_by_repeat"]
    assert goodput["processes"] == 1 and goodput["paired_by_process"] == pytest.approx([0.96, None])
    lines, reached = tables.batch_table(tables.pool_rows([_process(0), second]), ["goodput"])
    assert reached["paired"] == {"goodput": None}
    # 4 + 2 repeats against 3 + 3: as many in all, but position 4 would pair across the processes
    first = _process(0)
    _mode(first, "varK:goodput")["tokens_per_s_by_repeat"] = [150.0] * 4
    _mode(second := _process(1), "varK:goodput")["tokens_per_s_by_repeat"] = [200.0] * 2
    pooled = tables.pool_rows([first, second])
    assert tables.paired_ratios(_mode(pooled, "varK:goodput"), _mode(pooled, "fixed:4")) == []
    assert _mode(pooled, "varK:goodput")["paired_by_process"] == [None, None]


def test_render_pools_the_process_files_and_says_so(tables, tmp_path):
    (tmp_path / "code.p1.json").write_text(json.dumps(_process(0)))
    (tmp_path / "code.p2.json").write_text(json.dumps(_process(1)))
    (tmp_path / "rare.json").write_text(json.dumps(_process(0)))
    records = {("code", p): {"workload": "code", "process": p, "command": f"bench --json code.p{p}.json",
                             "uptime_before": "load average: 1.00, 1.00, 1.00", "seconds": 10.0 * p,
                             "uptime_after": "load average: 2.00, 2.00, 2.00", "exit_code": 0 if p == 1 else 1}
               for p in (2, 1)}
    text = tables.render(tmp_path, ["code", "rare"], ["goodput", "smallest_covering"], records)
    assert "The repeats of code come from 2 bench processes" in text and "still optimistic" in text
    assert ("`bench --json code.p1.json` × 2 processes (the same with .p2), round-robin with the other workloads:  \n"
            "p1: 10.0 s; load before: 1.00, 1.00, 1.00, after: 2.00, 2.00, 2.00  \n"
            "p2: 20.0 s; load before: 1.00, 1.00, 1.00, after: 2.00, 2.00, 2.00; **bench exit code 1**") in text
    code, rare = text.index("#### code"), text.index("#### rare")
    assert "0.960, 0.990" in text[code:rare] and "paired per process" not in text[rare:]
    assert "different prompts" not in text
    (tmp_path / "code.json").write_text(json.dumps(_process(1)))  # one bench's file comes first
    text = tables.render(tmp_path, ["code"], ["goodput"], records)
    assert "bench processes" not in text and "paired per process" not in text


def _sections(text: str) -> dict[str, str]:
    """Each workload's section of rendered tables, by name."""
    parts = text.split("#### ")[1:]
    return {part.split(":", 1)[0]: part for part in parts}


def test_a_workload_not_run_again_is_read_from_the_earlier_folder_it_was_made_in(tables, tmp_path):
    new, old, older = tmp_path / "new", tmp_path / "old", tmp_path / "older"
    for folder in (new, old, older):
        folder.mkdir()
    (new / "code.p1.json").write_text(json.dumps(_process(0)))
    (old / "code.p1.json").write_text(json.dumps(_process(1)))  # superseded by new's
    (old / "rare.p1.json").write_text(json.dumps(_process(1)))
    (older / "rare.json").write_text(json.dumps(_process(0)))  # old comes first
    (older / "thirdparty.json").write_text(json.dumps(_process(0)))
    old_records = {("rare", 1): {"workload": "rare", "process": 1, "command": "bench --json old/rare.p1.json",
                                 "uptime_before": "load average: 1.00, 1.00, 1.00", "seconds": 5.0,
                                 "uptime_after": "load average: 2.00, 2.00, 2.00", "exit_code": 0}}
    text = tables.render(new, ["code", "rare", "thirdparty", "stdlib_tests"], ["goodput"], {},
                         [(old, old_records), (older, {})])
    sections = _sections(text)
    assert "read from" not in sections["code"] and "0.960" in sections["code"]  # new's process 0 only
    assert f"(read from `{old.name}/`, an earlier run's folder)" in sections["rare"]
    assert "`bench --json old/rare.p1.json` × 1 process" in sections["rare"]
    assert f"(read from `{older.name}/`, an earlier run's folder)" in sections["thirdparty"]
    assert sections["stdlib_tests"].startswith("stdlib_tests: no results")
    alone = tables.render(new, ["code", "rare"], ["goodput"], {})
    assert alone == tables.render(new, ["code", "rare"], ["goodput"], {}, ()) and "rare: no results" in alone


def test_a_from_folder_that_does_not_exist_exits_2_before_any_bench(tables, capsys, tmp_path):
    assert tables.main(["--from", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--from {tmp_path / 'missing'}: no such directory" in err
    assert not (tmp_path / "out").exists()


def test_processes_that_decoded_different_prompts_are_flagged(tables, tmp_path):
    (tmp_path / "code.p1.json").write_text(json.dumps(_process(0, digest="ab" * 32)))
    (tmp_path / "code.p2.json").write_text(json.dumps(_process(1, digest="cd" * 32)))
    text = tables.render(tmp_path, ["code"], ["goodput"], {})
    assert "**the processes decoded different prompts (p1: abababababab; p2: cdcdcdcdcdcd)" in text
    assert "prompts sha256 abababababab, cdcdcdcdcdcd…" in text


def test_process_files_sort_by_process_number(tables, tmp_path):
    for name in ("code.p10.json", "code.p2.json", "code.p1.json", "code.p1.md", "code.json", "code.px.json"):
        (tmp_path / name).write_text("[]")
    assert [p for p, _ in tables.process_files(tmp_path, "code")] == [1, 2, 10]


def test_processes_below_1_exit_2_before_any_bench(tables, capsys, tmp_path):
    assert tables.main(["--processes", "0", "--out", str(tmp_path)]) == 2
    assert "--processes must be at least 1" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    assert tables.parse_args([]).processes == 1


@pytest.fixture
def fake_bench(tables, monkeypatch):
    """``subprocess.run`` of the script as a bench that writes one process's rows to its --json
    path; the commands it was given, in order."""
    from types import SimpleNamespace

    commands = []

    def run(command, **_):
        commands.append(command)
        path = Path(command[command.index("--json") + 1])
        path.write_text(json.dumps(_process(1 if path.name.endswith(".p2.json") else 0)))
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(tables, "subprocess", SimpleNamespace(run=run))
    monkeypatch.setattr(tables, "uptime", lambda: "load average: 1.00, 1.00, 1.00")
    return commands


def test_several_processes_run_round_robin_into_their_own_files(tables, fake_bench, tmp_path, capsys):
    # an earlier single-process run of code would win over the new processes; a third process is stale
    for stale in ("code.json", "code.md", "code.p3.json", "code.p3.log"):
        (tmp_path / stale).write_text("[]")
    (tmp_path / "runs.json").write_text(json.dumps([{"workload": "code", "command": "old"},
                                                    {"workload": "thirdparty", "command": "kept"}]))
    assert tables.main(["--processes", "2", "--workloads", "code,rare", "--out", str(tmp_path)]) == 0
    jsons = [Path(c[c.index("--json") + 1]).name for c in fake_bench]
    assert jsons == ["code.p1.json", "rare.p1.json", "code.p2.json", "rare.p2.json"]
    assert all(c[c.index("--repeats") + 1] == "3" for c in fake_bench)
    assert sorted(p.name for p in tmp_path.glob("code*")) == [
        "code.p1.json", "code.p1.log", "code.p1.md", "code.p2.json", "code.p2.log", "code.p2.md"]
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [(r["workload"], r.get("process")) for r in runs] == [
        ("thirdparty", None), ("code", 1), ("rare", 1), ("code", 2), ("rare", 2)]
    assert runs[3]["command"].endswith("code.p2.json --markdown --set workload.count=24")
    tables_md = (tmp_path / "tables.md").read_text()
    assert "The repeats of every workload come from 2 bench processes" in tables_md
    assert "× 2 processes (the same with .p2)" in tables_md and "0.960, 0.990" in tables_md
    assert tables.plan(["a", "b"], 3) == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]


def test_processes_added_with_first_process_pool_with_the_earlier_ones(tables, fake_bench, tmp_path, capsys):
    assert tables.main(["--processes", "2", "--workloads", "code", "--out", str(tmp_path)]) == 0
    earlier = tmp_path / "earlier"  # the first two ran into another directory, copied here
    runs = json.loads((tmp_path / "runs.json").read_text())
    for r in runs:
        r["command"] = r["command"].replace(str(tmp_path), str(earlier))
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    fake_bench.clear()
    assert tables.main(["--processes", "2", "--first-process", "3", "--workloads", "code", "--out", str(tmp_path)]) == 0
    assert [Path(c[c.index("--json") + 1]).name for c in fake_bench] == ["code.p3.json", "code.p4.json"]
    assert [p for p, _ in tables.process_files(tmp_path, "code")] == [1, 2, 3, 4]
    assert [r.get("process") for r in json.loads((tmp_path / "runs.json").read_text())] == [1, 2, 3, 4]
    text = (tmp_path / "tables.md").read_text()
    assert "The repeats of every workload come from 4 bench processes" in text
    # each command once, with the processes that ran it
    assert f"{earlier}/code.p1.json" in text and "× 2 processes (the same with .p2)" in text
    assert "× 2 processes (the same with .p4)" in text and "p3: " in text and "p4: " in text
    # one more process, numbered: its own file, never <name>.json
    fake_bench.clear()
    assert tables.main(["--first-process", "5", "--workloads", "code", "--out", str(tmp_path)]) == 0
    assert [Path(c[c.index("--json") + 1]).name for c in fake_bench] == ["code.p5.json"]
    assert "× 3 processes (the same with .p4, .p5)" in (tmp_path / "tables.md").read_text()
    # a single-process result would be read instead of the added processes: refused before any bench
    (tmp_path / "code.json").write_text("[]")
    fake_bench.clear()
    assert tables.main(["--first-process", "6", "--workloads", "code", "--out", str(tmp_path)]) == 2
    assert fake_bench == [] and "single-process result" in capsys.readouterr().err
    assert tables.main(["--first-process", "0", "--out", str(tmp_path)]) == 2


def test_one_process_keeps_the_file_names_and_records_of_before(tables, fake_bench, tmp_path, capsys):
    record = {"workload": "code", "command": "old", "uptime_before": "load average: 1.00, 1.00, 1.00",
              "seconds": 5.0, "uptime_after": "load average: 3.00, 3.00, 3.00", "exit_code": 0}
    (tmp_path / "runs.json").write_text(json.dumps([record, dict(record, workload="rare", command="rare's")]))
    (tmp_path / "code.json").write_text(json.dumps(_process(0)))
    (tmp_path / "rare.json").write_text(json.dumps(_process(0)))
    # a directory from before --processes renders its records as before
    assert tables.main(["--render-only", "--workloads", "code,rare", "--out", str(tmp_path)]) == 0
    assert "`old`  \n5.0 s; load before: 1.00, 1.00, 1.00, after: 3.00, 3.00, 3.00\n" in capsys.readouterr().out
    (tmp_path / "code.p1.json").write_text("[]")  # left by an earlier run with several processes
    assert tables.main(["--workloads", "code", "--out", str(tmp_path)]) == 0
    assert [Path(c[c.index("--json") + 1]).name for c in fake_bench] == ["code.json"]
    assert sorted(p.name for p in tmp_path.glob("code*")) == ["code.json", "code.log", "code.md"]
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [r["workload"] for r in runs] == ["code", "rare"] and all("process" not in r for r in runs)
    assert runs[0]["command"].endswith("code.json --markdown --set workload.count=24")
    text = (tmp_path / "tables.md").read_text()
    assert "bench processes" not in text and "paired per process" not in text and "round-robin" not in text


def test_processes_in_a_pool_folder_join_a_workload_s_own(tables, tmp_path, capsys):
    new, old = tmp_path / "new", tmp_path / "old"
    for folder in (new, old):
        folder.mkdir()
    (new / "code.p3.json").write_text(json.dumps(_process(1)))
    (old / "code.p1.json").write_text(json.dumps(_process(0)))
    (old / "rare.p1.json").write_text(json.dumps(_process(0)))  # not in new: only read with --from
    old_records = {("code", 1): {"workload": "code", "process": 1, "command": "bench --json old/code.p1.json",
                                 "uptime_before": "load average: 1.00, 1.00, 1.00", "seconds": 5.0,
                                 "uptime_after": "load average: 2.00, 2.00, 2.00", "exit_code": 0}}
    text = tables.render(new, ["code", "rare"], ["goodput"], {}, (), [(old, old_records, None)])
    sections = _sections(text)
    assert f"(pooled with p1 from `{old.name}/`)" in sections["code"]
    assert "0.960, 0.990" in sections["code"]  # p1's own paired median, then p3's
    assert "`bench --json old/code.p1.json` × 1 process" in sections["code"]
    assert sections["rare"].startswith("rare: no results")
    text = tables.render(new, ["code", "rare"], ["goodput"], {}, [(old, old_records)], [(old, old_records, None)])
    assert "pooled with" not in _sections(text)["rare"] and "read from" in _sections(text)["rare"]
    later = tmp_path / "later"  # only the first pool folder that has a workload's processes is pooled
    later.mkdir()
    (later / "code.p3.json").write_text(json.dumps(_process(0)))
    assert _sections(tables.render(new, ["code"], ["goodput"], {}, (), [(old, {}, None), (later, {}, None)])) == \
        _sections(tables.render(new, ["code"], ["goodput"], {}, (), [(old, {}, None)]))
    (new / "code.p1.json").write_text(json.dumps(_process(1)))  # the same number in both: refused
    with pytest.raises(SystemExit, match="process 1 is in both"):
        tables.render(new, ["code"], ["goodput"], {}, (), [(old, old_records, None)])
    text = tables.render(new, ["code"], ["goodput"], {}, (), [(old, {}, {"rare"})])  # a pool for other workloads
    assert "pooled with" not in text and "process 1 is in both" not in text
    assert tables.pool_arg(f"{old}=rare, code") == (old, {"rare", "code"}) and tables.pool_arg(str(old)) == (old, None)
    assert tables.main(["--pool", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    assert f"--pool {tmp_path / 'missing'}: no such directory" in capsys.readouterr().err
