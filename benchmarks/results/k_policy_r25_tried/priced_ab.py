"""Per cell of a live A/B (round 25's readout): each process's priced regret of goodput and of the variant (the bench
JSON's regret_vs_best_static: the run's decisions priced by the bench's one cost model), then their means over the
cells. From the repository root:
    python benchmarks/results/k_policy_r25_tried/priced_ab.py benchmarks/results/k_policy_r25_tried duel goodput_duel
    python benchmarks/results/k_policy_r25_tried/priced_ab.py benchmarks/results/k_policy_r25_tried relearn goodput_relearn
    python benchmarks/results/k_policy_r25_tried/priced_ab.py benchmarks/results/k_policy_r24_tried aa goodput_aa"""
import glob, json, sys, statistics
folder, prefix, variant = sys.argv[1:4]
ws = sorted({f.split(prefix + "_")[1].split(".p")[0] for f in glob.glob(f"{folder}/{prefix}_*.p*.json")})
tot = {"goodput": [], variant: []}
for w in ws:
    procs = [json.load(open(f)) for f in sorted(glob.glob(f"{folder}/{prefix}_{w}.p*.json"))]
    for b in (1, 2, 4, 8):
        line = []
        for m in ("goodput", variant):
            regs = []
            for rows in procs:
                for r in rows:
                    if r["batch_size"] == b and r["mode"].replace("varK:", "") == m:
                        regs.append(r.get("regret_vs_best_static"))
            regs = [x for x in regs if x is not None]
            if regs:
                tot[m].append(statistics.mean(regs))
            line.append(f"{m}: " + ", ".join(f"{x*100:+.1f}" for x in regs))
        print(f"{w} b{b}: " + " | ".join(line))
for m, v in tot.items():
    print(m, "mean regret %+.2f%%" % (statistics.mean(v) * 100), "cells below -3%:", sum(x < -0.03 for x in v), "of", len(v))
