"""Issue 23's live A/Bs of a K policy variant against goodput, per cell, from the bench JSON of one folder.

Rounds 23 and 24 ran ``spdflow bench`` with modes ``nospec,fixed:all,goodput,<variant>`` at batch 1, 2, 4
and 8, 2 processes round-robin over synthetic 0.9, 0.6, 0.3 and code, into ``<prefix>_<w>.p<p>.json``
(w: syn09, syn06, syn03, code). Per cell: the better static choice per process, the variant and goodput
paired ÷ it (pooled, then per process), variant ÷ goodput paired per repeat (median and range), and each
run's K counts (variant; goodput). Then the cells each reaches (paired ≥ 0.97) and the median ratio.

    python benchmarks/ab_summary.py benchmarks/results/k_policy_r23_tried switch_steps goodput_tail
    python benchmarks/ab_summary.py benchmarks/results/k_policy_r24_tried probe goodput_probe
    python benchmarks/ab_summary.py benchmarks/results/k_policy_r24_tried aa goodput_aa   # goodput against itself
"""
import glob
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from k_policy_tables import LINE, paired_ratios, reference_row  # noqa: E402

WORKLOADS = ("syn09", "syn06", "syn03", "code")


def main(folder: str, prefix: str, variant: str) -> None:
    A, B = "goodput", variant
    tot = {A: 0, B: 0}
    ratios = []
    for w in WORKLOADS:
        procs = [json.load(open(f)) for f in sorted(glob.glob(str(Path(folder) / f"{prefix}_{w}.p*.json")))]
        for b in (1, 2, 4, 8):
            paired = {A: [], B: []}
            per = {A: [], B: []}
            hist: dict[str, list] = {}
            ab, bests = [], []
            for rows in procs:
                batch = [r for r in rows if r["batch_size"] == b]
                by = {r["mode"].replace("varK:", ""): r for r in batch}
                if B not in by:
                    continue
                best = reference_row(batch)
                bests.append(best["mode"])
                for pol in paired:
                    rs = paired_ratios(by[pol], best)
                    paired[pol] += rs
                    per[pol].append(statistics.median(rs))
                    hist.setdefault(pol, []).append({k: int(v) for k, v in by[pol]["k_histogram"].items()})
                ab += paired_ratios(by[B], by[A])
            if not ab:
                continue
            med = {p: statistics.median(v) for p, v in paired.items()}
            for p in med:
                tot[p] += med[p] >= LINE
            r = statistics.median(ab)
            ratios.append(r)

            def fmt(hs):
                return " / ".join(" ".join(f"{k}:{v}" for k, v in sorted(h.items())) for h in hs)

            print(f"| {w} b{b} | {'/'.join(bests)} | {med[B]:.3f} ({', '.join(f'{x:.3f}' for x in per[B])}) | "
                  f"{med[A]:.3f} ({', '.join(f'{x:.3f}' for x in per[A])}) | {r:.3f} ({min(ab):.3f}-{max(ab):.3f}) | "
                  f"{fmt(hist[B])}; {fmt(hist[A])} |")
    print("cells:", len(ratios), "reached:", tot, f" median {B}/{A} over cells:",
          round(statistics.median(ratios), 3) if ratios else None)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[2])
    main(*sys.argv[1:])
