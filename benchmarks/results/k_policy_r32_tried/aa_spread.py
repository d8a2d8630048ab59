"""The A/A's spread over every live A/B of rounds 30-32: goodput registered twice (``goodput_aa``) and paired with
goodput in the same repeat, the design's noise when nothing differs. Per cell: the pooled paired median over the
A/B's processes (2 processes x 12 repeats; round 32's ab_r6 4 x 12) and each process's own median (12 repeats).

    python benchmarks/results/k_policy_r32_tried/aa_spread.py
"""
import math
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(RESULTS.parent))
from policy_ab import load_results, paired, pooled_paired  # noqa: E402

folders = sorted(p for p in RESULTS.glob("k_policy_r3[0-2]_tried/ab_*") if p.is_dir() and any(p.glob("*.json")))
pooled, single = [], []
for folder in folders:
    for (cell, batch), results in load_results(folder).items():
        if "varK:goodput_aa" not in results[0]["runs"]:
            continue
        pooled.append(pooled_paired(results, "varK:goodput_aa"))
        single += [statistics.median(paired(result, "varK:goodput_aa")) for result in results]


def describe(name: str, values: list[float]) -> None:
    logs = [math.log(v) for v in values]
    print(f"{name}: {len(values)} cells; median {statistics.median(values):.4f}; sd of log {statistics.stdev(logs):.4f}; "
          f"range {min(values):.3f}-{max(values):.3f}; below 0.985 {sum(v < 0.985 for v in values)}, below 0.97 "
          f"{sum(v < 0.97 for v in values)}, above 1.015 {sum(v > 1.015 for v in values)}, above 1.03 {sum(v > 1.03 for v in values)}")


print(f"{len(folders)} A/B folders: {', '.join(f'{p.parent.name}/{p.name}' for p in folders)}")
describe("pooled over each A/B's processes (24 repeats; 48 in ab_r6)", pooled)
describe("one process (12 repeats)", single)
