"""R2's live gate on folders of policy_ab.py JSON (any number of processes):
    python benchmarks/results/k_policy_r31_tried/gate_r2.py DIR [DIR ...] VARIANT_ROW"""
import statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_r7_module import gate_r7

*dirs, row = sys.argv[1:]
GUARD = gate_r7.ACT
GAIN = [("rare", 4), ("rare", 8), ("synthetic_0.3", 1), ("synthetic_0.3", 2), ("synthetic_0.3", 4), ("synthetic_0.3", 8)]
cells = gate_r7.load(dirs)
identical = all(r["identical"] for v in cells.values() for r in v)
guard = [gate_r7.pooled(cells, c, row) for c in GUARD]
gain, gain_aa = ([gate_r7.pooled(cells, c, name) for c in GAIN] for name in (row, "varK:goodput_aa"))
g_guard, g_gain, g_aa = (statistics.geometric_mean(v) for v in (guard, gain, gain_aa))
ok_guard = g_guard >= 0.995 and min(guard) >= 0.985
ok_gain = g_gain >= 1.010 and g_gain > g_aa
print(f"processes per cell: {sorted({len(v) for v in cells.values()})}; tokens equal no-spec: {identical}")
print("prompt lookup (guard): " + ", ".join(f"{c[0]} b{c[1]} {v:.3f}" for c, v in zip(GUARD, guard)))
print(f"  geometric mean {g_guard:.4f}, lowest {min(guard):.3f}: {'pass' if ok_guard else 'FAIL'}")
print("where skipping can be right: " + ", ".join(f"{c[0]} b{c[1]} {v:.3f}" for c, v in zip(GAIN, gain)))
print(f"  geometric mean {g_gain:.4f} (A/A {g_aa:.4f}): {'pass' if ok_gain else 'FAIL'}")
print("gate:", "PASS" if ok_guard and ok_gain and identical else "FAIL")
