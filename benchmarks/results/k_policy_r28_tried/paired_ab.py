"""Per cell of a live A/B (run_ab.sh's JSONs): the median over repeats, pooled over processes, of the variant's tok/s
over goodput's in the same repeat, and how many cells are at or above 1.00. From the repository root:
    python benchmarks/results/k_policy_r28_tried/paired_ab.py benchmarks/results/k_policy_r28_tried spell goodput_spell"""
import glob, json, statistics, sys
folder, prefix, variant = sys.argv[1:4]
ws = sorted({f.split(prefix + "_")[1].split(".p")[0] for f in glob.glob(f"{folder}/{prefix}_*.p*.json")})
above = 0; cells = 0
for w in ws:
    procs = [json.load(open(f)) for f in sorted(glob.glob(f"{folder}/{prefix}_{w}.p*.json"))]
    for b in (1, 2, 4, 8):
        ratios = []
        for rows in procs:
            by = {r["mode"].replace("varK:", ""): r for r in rows if r["batch_size"] == b}
            if "goodput" in by and variant in by:
                ratios += [v / g for v, g in zip(by[variant]["tokens_per_s_by_repeat"], by["goodput"]["tokens_per_s_by_repeat"])]
        if ratios:
            med = statistics.median(ratios); cells += 1; above += med >= 1.0
            print(f"{w} b{b}: paired {variant} / goodput median {med:.3f} (n={len(ratios)}, min {min(ratios):.3f}, max {max(ratios):.3f})")
print(f"cells at or above 1.00: {above} of {cells}")
