"""Validate ``spdflow whatif`` against ``spdflow bench`` on this machine.

    python benchmarks/whatif_validation.py recipes/tinycode_varK.yaml --out benchmarks/results/whatif_validation.json

1. Records one greedy source run of the recipe at batch 1 (smallest_covering over its K-list):
   the outputs every prediction replays.
2. For each (K-list, policy, batch sizes) group below, ``--rounds`` times, alternating: a real
   ``spdflow bench`` of the group (modes nospec, fixed, varK; ``--repeats`` interleaved repeats)
   and, right after it, the predictions of the same three modes from the source run with the
   ``measured`` cost model re-timed at that moment (``remeasure``). Nothing is fitted: the cost
   model is the shapes' own timing, the rest is the replay.
3. Prints one row per (K-list, policy, batch, mode): bench tok/s (median over rounds of each
   round's median), predicted tok/s, error, and both as ratios to no-spec of the same batch,
   with the load average before each step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

GROUPS = [
    ((0, 2, 4, 7), "smallest_covering", (1, 4, 8)),
    ((0, 4), "goodput", (2,)),
    ((0, 1, 2, 3), "smallest_covering", (2,)),
]


def load() -> float:
    return round(os.getloadavg()[0], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from spdflow.bench import BenchOptions, bench_recipe
    from spdflow.engine.run import Engine, RunOptions
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe
    from spdflow.whatif import Scenario, load_run, make_cost_model, replay

    pm = get_plugin_manager()
    work = Path(tempfile.mkdtemp(prefix="whatif-validation-"))
    source = work / "source"
    loaded = load_recipe(args.recipe, pm, ["k_policy=smallest_covering", f"output={source}",
                                           "specialization.batch_size=1"])
    Engine(pm, loaded, RunOptions()).run()
    run = load_run(source, pm)
    print(f"source run: {source} (load {load()})", file=sys.stderr)

    rows = []
    for ks, policy, batches in GROUPS:
        for round_ in range(args.rounds):
            overrides = [f"num_speculative_tokens={list(ks)}", f"k_policy={policy}", f"output={work / 'bench'}"]
            group = load_recipe(args.recipe, pm, overrides)
            before = load()
            bench_rows = bench_recipe(pm, group, BenchOptions(batch_sizes=list(batches), repeats=args.repeats,
                                                              modes=["nospec", "fixed", "varK"]))
            bench_load = (before, load())
            cost = make_cost_model(pm, run, "measured", {"remeasure": True})
            for batch in batches:
                modes = {"nospec": Scenario((0,), "nospec", batch), "fixed": Scenario(ks, "fixed", batch),
                         f"varK:{policy}": Scenario(ks, policy, batch)}
                for row in bench_rows:
                    if row["batch_size"] != batch or row["mode"] not in modes:
                        continue
                    prediction = replay(pm, run, modes[row["mode"]], cost)
                    rows.append({"k_list": list(ks), "policy": policy, "batch": batch, "mode": row["mode"],
                                 "round": round_, "bench_tok_s": row["tokens_per_s"],
                                 "bench_min": row["tokens_per_s_min"], "bench_max": row["tokens_per_s_max"],
                                 "bench_al": row["al"], "bench_k": row["k_histogram"],
                                 "pred_tok_s": prediction.figures.tokens_per_s, "pred_al": prediction.figures.al,
                                 "pred_k": {str(k): v for k, v in prediction.figures.k_usage.items()},
                                 "exact": prediction.exact, "identical": prediction.identical,
                                 "load_bench": bench_load, "load_predict": load()})
                    print(json.dumps(rows[-1]), file=sys.stderr)
    table = summarize(rows)
    print(markdown(table))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "table": table}, indent=2) + "\n")


def summarize(rows: list[dict]) -> list[dict]:
    """Median over rounds per (K-list, policy, batch, mode), errors absolute and as ratios to no-spec."""
    keys = []
    for r in rows:
        key = (tuple(r["k_list"]), r["policy"], r["batch"], r["mode"])
        if key not in keys:
            keys.append(key)
    out = []
    for key in keys:
        mine = [r for r in rows if (tuple(r["k_list"]), r["policy"], r["batch"], r["mode"]) == key]
        base = [r for r in rows if (tuple(r["k_list"]), r["policy"], r["batch"], r["mode"]) == key[:3] + ("nospec",)]
        bench = statistics.median(r["bench_tok_s"] for r in mine)
        pred = statistics.median(r["pred_tok_s"] for r in mine)
        bench_ratio = statistics.median(r["bench_tok_s"] / b["bench_tok_s"] for r, b in zip(mine, base))
        pred_ratio = statistics.median(r["pred_tok_s"] / b["pred_tok_s"] for r, b in zip(mine, base))
        out.append({"k_list": list(key[0]), "policy": key[1], "batch": key[2], "mode": key[3], "bench_tok_s": bench,
                    "pred_tok_s": pred, "error": pred / bench - 1, "bench_ratio": bench_ratio, "pred_ratio": pred_ratio,
                    "ratio_error": pred_ratio / bench_ratio - 1, "exact": all(r["exact"] for r in mine),
                    "loads": sorted({x for r in mine for x in (*r["load_bench"], r["load_predict"])})})
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| K-list | policy | batch | mode | bench tok/s | predicted tok/s | error | bench ÷ no-spec | "
             "predicted ÷ no-spec | ratio error | load (1 min) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in table:
        mode = t["mode"] + ("" if t["exact"] else " (estimate)")
        lines.append(f"| {t['k_list']} | {t['policy']} | {t['batch']} | {mode} | {t['bench_tok_s']:.1f} | "
                     f"{t['pred_tok_s']:.1f} | {t['error']:+.1%} | {t['bench_ratio']:.3f} | {t['pred_ratio']:.3f} | "
                     f"{t['ratio_error']:+.1%} | {min(t['loads']):.1f}–{max(t['loads']):.1f} |")
    errors = [abs(t["error"]) for t in table]
    ratio_errors = [abs(t["ratio_error"]) for t in table if t["mode"] != "nospec"]
    lines.append("")
    lines.append(f"median |error| {statistics.median(errors):.1%} over {len(errors)} combinations; "
                 f"median |ratio error| {statistics.median(ratio_errors):.1%} over {len(ratio_errors)} (no-spec rows are 1 by definition)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
