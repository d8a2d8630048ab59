"""Round 24 of issue 23: the A/A per cell (goodput against itself), from the bench JSON beside this file.

    python benchmarks/results/k_policy_r24_tried/aa_summary.py

Per cell: the better static choice per process, goodput_aa and goodput paired ÷ it (pooled, then per
process), goodput_aa ÷ goodput paired per repeat (median and range), and each run's K counts.
"""
import json, statistics, glob
from pathlib import Path
HERE = Path(__file__).resolve().parent
LINE = 0.97
A, B = "goodput", "goodput_aa"
tot = {A: 0, B: 0}; ratios = []; cells = 0
for w in ("syn09", "syn06", "syn03", "code"):
    procs = [json.load(open(f)) for f in sorted(glob.glob(str(HERE / f"aa_{w}.p*.json")))]
    if not procs:
        continue
    for b in (1, 2, 4, 8):
        paired = {A: [], B: []}; ab = []; hist = {}; per = {A: [], B: []}; bests = []
        for rows in procs:
            by = {r["mode"].replace("varK:", ""): r for r in rows if r["batch_size"] == b}
            if B not in by:
                continue
            statics = [m for m in by if m == "nospec" or m.startswith("fixed")]
            best = max(statics, key=lambda m: by[m]["tokens_per_s"]); bests.append(best)
            n = len(by[best]["tokens_per_s_by_repeat"])
            for pol in paired:
                rs = [by[pol]["tokens_per_s_by_repeat"][i] / by[best]["tokens_per_s_by_repeat"][i] for i in range(n)]
                paired[pol] += rs; per[pol].append(statistics.median(rs))
                hist.setdefault(pol, []).append({k: int(v) for k, v in by[pol]["k_histogram"].items()})
            ab += [by[B]["tokens_per_s_by_repeat"][i] / by[A]["tokens_per_s_by_repeat"][i] for i in range(n)]
        if not ab:
            continue
        cells += 1
        med = {p: statistics.median(v) for p, v in paired.items()}
        for p in med:
            tot[p] += med[p] >= LINE
        r = statistics.median(ab); ratios.append(r)
        fmt = lambda hs: " / ".join(" ".join(f"{k}:{v}" for k, v in sorted(h.items())) for h in hs)
        print(f"| {w} b{b} | {'/'.join(bests)} | {med[B]:.3f} ({', '.join(f'{x:.3f}' for x in per[B])}) | "
              f"{med[A]:.3f} ({', '.join(f'{x:.3f}' for x in per[A])}) | {r:.3f} ({min(ab):.3f}-{max(ab):.3f}) | "
              f"{fmt(hist[B])}; {fmt(hist[A])} |")
print("cells:", cells, "reached:", tot, " median aa/goodput over cells:",
      round(statistics.median(ratios), 3) if ratios else None)
