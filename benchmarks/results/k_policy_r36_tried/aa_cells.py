"""Issue 23, round 36: the tables' A/A. Per cell of a k_policy_tables.py run with ``--policies aa_k7``, the paired
ratio (pooled over processes as the tables pair: repeats paired within a process) of ``varK:aa_k7`` to ``fixed:7``
(the same schedule, K = 7 on every step), and of each of aa_k7, fixed:7 and goodput to the tables' reference,
max(no-spec, best fixed K). From the repository root:

    python benchmarks/results/k_policy_r36_tried/aa_cells.py benchmarks/results/k_policy_r36_aa
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
from k_policy_tables import LINE, paired_ratios, pool_rows, reference_row  # noqa: E402

folder = Path(sys.argv[1])
aa, below = [], 0
print("| cell | aa_k7 ÷ fixed:7, paired (min–max) | reference | fixed:7 ÷ ref | aa_k7 ÷ ref | goodput ÷ ref |")
print("|---|---|---|---|---|---|")
for workload in sorted({path.name.split(".p")[0] for path in folder.glob("*.p*.json")}):
    processes = [json.loads(path.read_text()) for path in sorted(folder.glob(f"{workload}.p*.json"))]
    assert all(row["identical_to_nospec"] for rows in processes for row in rows), f"{workload}: a run differs from no-spec"
    rows = pool_rows(processes)
    for batch in (1, 2, 4, 8):
        mine = {row["mode"]: row for row in rows if row["batch_size"] == batch}
        if not mine:
            continue
        reference = reference_row(list(mine.values()))
        same = paired_ratios(mine["varK:aa_k7"], mine["fixed:7"])
        to_ref = {m: statistics.median(paired_ratios(mine[m], reference)) for m in ("fixed:7", "varK:aa_k7", "varK:goodput")}
        aa.append(statistics.median(same))
        below += aa[-1] < LINE
        print(f"| {workload} b{batch} | {aa[-1]:.3f} ({min(same):.3f}–{max(same):.3f}) | {reference['mode']} | "
              f"{to_ref['fixed:7']:.3f} | {to_ref['varK:aa_k7']:.3f} | {to_ref['varK:goodput']:.3f} |")
print()
print(f"{len(aa)} cells: aa_k7 ÷ fixed:7 geometric mean {statistics.geometric_mean(aa):.4f}, median {statistics.median(aa):.3f}, "
      f"range {min(aa):.3f}–{max(aa):.3f}, spread (sd) {statistics.stdev(aa) * 100:.1f} points, below {LINE}: {below}")
