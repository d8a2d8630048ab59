"""Rounds 34 and 35: per cell, goodput's and a variant's paired ratio to max(no-spec, best fixed K) and the variant's to
goodput, each process paired against its own reference (``k_policy_tables.reference_row``), pooled over processes.
From the repository root (the variant defaults to round 34's goodput_hold):
    python benchmarks/results/k_policy_r34_tried/paired_cells.py benchmarks/results/k_policy_r34_tried/tables_r1
    python benchmarks/results/k_policy_r34_tried/paired_cells.py benchmarks/results/k_policy_r35 goodput_r35"""
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
from k_policy_tables import paired_ratios, reference_row  # noqa: E402

VARIANT = "varK:" + (sys.argv[2] if len(sys.argv) > 2 else "goodput_hold")
POLICIES = ("varK:goodput", VARIANT)
folder = Path(sys.argv[1])
medians = {p: [] for p in POLICIES}
for workload in sorted({path.name.split(".p")[0] for path in folder.glob("*.p*.json")}):
    processes = [json.loads(path.read_text()) for path in sorted(folder.glob(f"{workload}.p*.json"))]
    for batch in (1, 2, 4, 8):
        pairs, versus = {p: [] for p in POLICIES}, []
        for rows in processes:
            mine = {row["mode"]: row for row in rows if row["batch_size"] == batch}
            if not mine:
                continue
            assert all(row["identical_to_nospec"] for row in mine.values())
            reference = reference_row(list(mine.values()))
            for policy in POLICIES:
                pairs[policy] += paired_ratios(mine[policy], reference)
            versus += paired_ratios(mine[VARIANT], mine["varK:goodput"])
        if not versus:
            continue
        cell = {p: statistics.median(pairs[p]) for p in POLICIES}
        for policy in POLICIES:
            medians[policy].append(cell[policy])
        print(f"{workload} b{batch} n={len(versus)} goodput {cell['varK:goodput']:.3f} "
              f"{VARIANT[5:]} {cell[VARIANT]:.3f} {VARIANT[5:]}/goodput {statistics.median(versus):.3f}")
for policy, values in medians.items():
    print(policy.removeprefix("varK:"), "geomean %.4f" % math.exp(sum(map(math.log, values)) / len(values)),
          "reached", sum(v >= 0.97 for v in values), "of", len(values))
