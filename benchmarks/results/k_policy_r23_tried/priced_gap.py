"""Round 23 of issue 23: how far below its priced tok/s a policy measures, against the fixed-K rows.

For every table file of a folder (default: round 21's) and batch size: the policy's measured ÷ priced
tok/s, over the median of the same ratio for the fixed-K rows of that bench (their priced figures are
the oracle detail's ``fixed_priced_tokens_per_s``). Prints the median and range per batch size.

    python benchmarks/results/k_policy_r23_tried/priced_gap.py [FOLDER]   # from the repository root
"""
import collections
import glob
import json
import statistics
import sys

folder = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/k_policy_r21"
gaps = collections.defaultdict(lambda: collections.defaultdict(list))
for path in sorted(glob.glob(f"{folder}/*.p*.json")):
    rows = json.load(open(path))
    for batch in (1, 2, 4, 8):
        by = {r["mode"]: r for r in rows if r.get("batch_size") == batch}
        fixed_priced = None
        for row in by.values():
            if row.get("oracle_detail"):
                fixed_priced = row["oracle_detail"]["fixed_priced_tokens_per_s"]
        if not fixed_priced:
            continue
        fixed = [by[m]["tokens_per_s"] / fixed_priced[m.split(":")[1]] for m in by
                 if m.startswith("fixed:") and m.split(":")[1] in fixed_priced]
        for mode, row in by.items():
            if mode.startswith("varK:") and row.get("policy_priced_tokens_per_s"):
                gaps[mode][batch].append(row["tokens_per_s"] / row["policy_priced_tokens_per_s"] / statistics.median(fixed))
for mode, per in gaps.items():
    for batch, values in sorted(per.items()):
        print(f"{mode} batch {batch}: median {statistics.median(values):.3f} "
              f"({min(values):.3f}-{max(values):.3f}) over {len(values)} files")
