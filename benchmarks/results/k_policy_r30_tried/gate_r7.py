"""R7/R8/R9's live gate on a folder of policy_ab.py JSON (any number of processes):
    python benchmarks/results/k_policy_r30_tried/gate_r7.py DIR [DIR ...] VARIANT_ROW
(round 31's gate_r2.py and gate_r3.py use load, pooled and main)"""
import statistics, sys
sys.path.insert(0, "benchmarks")
from policy_ab import load_results, pooled_paired
ACT = [("code", 4), ("code", 8), ("stdlib_tests", 4), ("stdlib_tests", 8), ("thirdparty", 4), ("thirdparty", 8)]
SAFE = [("rare", 4), ("rare", 8), ("synthetic_0.3", 1), ("synthetic_0.3", 4), ("synthetic_0.3", 8)]
ALIAS = {"stdlib": "stdlib_tests", "syn03": "synthetic_0.3"}


def load(dirs):
    """(workload, batch) -> every process's result in ``dirs``."""
    cells = {}
    for (cell, batch), results in load_results(*dirs).items():
        cells.setdefault((ALIAS.get(cell, cell), batch), []).extend(results)
    return cells


def pooled(cells, cell, name):
    """The median over every process's repeats of ``name``'s tok/s ÷ goodput's in the same repeat."""
    return pooled_paired(cells[cell], name)


def main(argv, safe=SAFE):
    *dirs, row = argv
    cells = load(dirs)
    act = [pooled(cells, c, row) for c in ACT]; act_aa = [pooled(cells, c, "varK:goodput_aa") for c in ACT]
    safe_v = [pooled(cells, c, row) for c in safe]
    g, g_aa, g_safe = (statistics.geometric_mean(v) for v in (act, act_aa, safe_v))
    ok_act = g >= 1.010 and sum(v >= 1.0 for v in act) >= 4 and g > g_aa
    ok_safe = min(safe_v) >= 0.985 and g_safe >= 0.995
    print(f"processes per cell: {sorted({len(v) for v in cells.values()})}")
    print("prompt lookup: " + ", ".join(f"{c[0]} b{c[1]} {v:.3f}" for c, v in zip(ACT, act)))
    print(f"  geometric mean {g:.4f} (A/A {g_aa:.4f}), {sum(v >= 1.0 for v in act)} of 6 at or above 1.00: {'pass' if ok_act else 'FAIL'}")
    print("where skipping is right: " + ", ".join(f"{c[0]} b{c[1]} {v:.3f}" for c, v in zip(safe, safe_v)))
    print(f"  geometric mean {g_safe:.4f}, lowest {min(safe_v):.3f}: {'pass' if ok_safe else 'FAIL'}")
    print("gate:", "PASS" if ok_act and ok_safe else "FAIL")


if __name__ == "__main__":
    main(sys.argv[1:])
