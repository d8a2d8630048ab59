"""Rounds 34 and 35: per cell, goodput's and a variant's paired ratio to max(no-spec, best fixed K), from the
repository root (the variant defaults to round 34's goodput_hold):
    python benchmarks/results/k_policy_r34_tried/paired_cells.py benchmarks/results/k_policy_r34_tried/tables_r1
    python benchmarks/results/k_policy_r34_tried/paired_cells.py benchmarks/results/k_policy_r35 goodput_r35
        each process paired against its own reference (``k_policy_tables.reference_row``), pooled over processes,
        and the variant's ratio to goodput;
    python benchmarks/results/k_policy_r34_tried/paired_cells.py benchmarks/results/k_policy_r35 goodput_r35 --pooled
        as the tables pair and print them (``pool_rows``, one reference from the pooled medians, 3 decimals): round 35's gates
        (``gate_r1.txt``, ``gate_r2.txt``), with each cell's difference and the worst one."""
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
from k_policy_tables import paired_ratios, pool_rows, reference_row  # noqa: E402

args = [a for a in sys.argv[1:] if a != "--pooled"]
POOLED = "--pooled" in sys.argv[1:]
VARIANT = "varK:" + (args[1] if len(args) > 1 else "goodput_hold")
POLICIES = ("varK:goodput", VARIANT)
NAME = VARIANT.removeprefix("varK:")
folder = Path(args[0])
medians = {p: [] for p in POLICIES}
for workload in sorted({path.name.split(".p")[0] for path in folder.glob("*.p*.json")}):
    processes = [json.loads(path.read_text()) for path in sorted(folder.glob(f"{workload}.p*.json"))]
    assert all(row["identical_to_nospec"] for rows in processes for row in rows), f"{workload}: a run differs from no-spec"
    for batch in (1, 2, 4, 8):
        pairs, versus = {p: [] for p in POLICIES}, []
        for rows in [pool_rows(processes)] if POOLED else processes:
            mine = {row["mode"]: row for row in rows if row["batch_size"] == batch}
            if not mine:
                continue
            reference = reference_row(list(mine.values()))
            for policy in POLICIES:
                pairs[policy] += paired_ratios(mine[policy], reference)
            versus += paired_ratios(mine[VARIANT], mine["varK:goodput"])
        if not versus:
            continue
        cell = {p: statistics.median(pairs[p]) for p in POLICIES}
        if POOLED:  # the 3 decimals the tables print, which the gates read
            cell = {p: round(value, 3) for p, value in cell.items()}
        for policy in POLICIES:
            medians[policy].append(cell[policy])
        if POOLED:
            print(f"{workload} b{batch}: goodput {cell['varK:goodput']:.3f} {NAME} {cell[VARIANT]:.3f} "
                  f"diff {100 * (cell[VARIANT] - cell['varK:goodput']):+.1f}")
        else:
            print(f"{workload} b{batch} n={len(versus)} goodput {cell['varK:goodput']:.3f} "
                  f"{NAME} {cell[VARIANT]:.3f} {NAME}/goodput {statistics.median(versus):.3f}")
if POOLED:
    mine, theirs = medians[VARIANT], medians["varK:goodput"]
    print(f"{len(mine)} cells; reached (paired >= 0.97): goodput {sum(v >= 0.97 for v in theirs)} "
          f"{NAME} {sum(v >= 0.97 for v in mine)}")
    print("geomean goodput %.4f %s %.4f" % (math.exp(statistics.fmean(map(math.log, theirs))), NAME,
                                           math.exp(statistics.fmean(map(math.log, mine)))))
    print("worst diff %.1f points" % (100 * min(a - b for a, b in zip(mine, theirs))))
else:
    for policy, values in medians.items():
        print(policy.removeprefix("varK:"), "geomean %.4f" % math.exp(sum(map(math.log, values)) / len(values)),
              "reached", sum(v >= 0.97 for v in values), "of", len(values))
