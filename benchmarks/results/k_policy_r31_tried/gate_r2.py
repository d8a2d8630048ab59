"""R2's live gate on folders of policy_ab.py JSON (any number of processes):
    python benchmarks/results/k_policy_r31_tried/gate_r2.py DIR [DIR ...] VARIANT_ROW"""
import json, statistics, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from policy_ab import paired
*dirs, row = sys.argv[1:]
GUARD = [("code", 4), ("code", 8), ("stdlib_tests", 4), ("stdlib_tests", 8), ("thirdparty", 4), ("thirdparty", 8)]
GAIN = [("rare", 4), ("rare", 8), ("synthetic_0.3", 1), ("synthetic_0.3", 2), ("synthetic_0.3", 4), ("synthetic_0.3", 8)]
cells = {}
for d in dirs:
    for path in Path(d).glob("*.json"):
        r = json.loads(path.read_text())
        cells.setdefault((r["cell"], r["batch"]), []).append(r)
def pooled(cell, name):
    return statistics.median([x for r in cells[cell] for x in paired(r, name)])
identical = all(r["identical"] for v in cells.values() for r in v)
guard = [pooled(c, row) for c in GUARD]
gain, gain_aa = [pooled(c, row) for c in GAIN], [pooled(c, "varK:goodput_aa") for c in GAIN]
g_guard, g_gain, g_aa = (statistics.geometric_mean(v) for v in (guard, gain, gain_aa))
ok_guard = g_guard >= 0.995 and min(guard) >= 0.985
ok_gain = g_gain >= 1.010 and g_gain > g_aa
print(f"processes per cell: {sorted({len(v) for v in cells.values()})}; tokens equal no-spec: {identical}")
print("prompt lookup (guard): " + ", ".join(f"{c[0]} b{c[1]} {v:.3f}" for c, v in zip(GUARD, guard)))
print(f"  geometric mean {g_guard:.4f}, lowest {min(guard):.3f}: {'pass' if ok_guard else 'FAIL'}")
print("where skipping can be right: " + ", ".join(f"{c[0]} b{c[1]} {v:.3f}" for c, v in zip(GAIN, gain)))
print(f"  geometric mean {g_gain:.4f} (A/A {g_aa:.4f}): {'pass' if ok_gain else 'FAIL'}")
print("gate:", "PASS" if ok_guard and ok_gain and identical else "FAIL")
