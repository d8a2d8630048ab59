"""Replay one recorded run (k_policy_replay.py --make-runs) under goodput-steady at batch B, noise seed 1,
and print each step's K, the rows' proposal lengths and tokens left, the last K, the rates and extra[K_max].
From the repository root (round 25's finding F1):
    python benchmarks/results/k_policy_r25_tried/trace_replay.py RUNS/synthetic_0.9 8 [KEY=VALUE ...]"""
import sys, random
sys.path.insert(0, "benchmarks")
from pathlib import Path
import k_policy_replay as kpr
from spdflow.oracle import oracle_report
from spdflow.plugins import get_plugin_manager
run_dir, batch = Path(sys.argv[1]), int(sys.argv[2])
settings = dict(a.split("=") for a in sys.argv[3:])
settings = {k: float(v) for k, v in settings.items()}
pm = get_plugin_manager()
plugin, steady = kpr.steady_plugin(settings)
pm.add_plugin(plugin, "k-policy-replay", version="1.0")
log = []
orig = steady.choose_k
def choose(self, counts, ks):
    k = orig(self, counts, ks)
    r = self.rates(counts, weights=self.row_weights(), grades=self.row_grades(len(counts)))
    log.append((k, tuple(counts), tuple(self.left), self.costs.last_k, {kk: round(v) for kk, v in r.items()},
                round(self.acceptance.expected_extra()[-1], 2)))
    return k
steady.choose_k = choose
run, cost = kpr.load_for_replay(pm, run_dir, steady, 0.2)
steady.rng = random.Random(f"{run_dir.name}:{batch}:1")
rep = oracle_report(pm, run, cost, steady.name, batch)
print("regret", rep.regret, "eff", rep.efficiency)
print("verify ms", {k: round(v * 1e3, 3) for k, v in cost.grid[batch].verify_s.items()} if hasattr(cost, "grid") else "")
for i, row in enumerate(log):
    print(i, *row)
