"""Round 23 of issue 23: one process's mean verify time per step of no-spec and fixed-K generations
(synthetic 0.6, 16 prompts), with static sessions or one dynamic session. Prints one JSON line.

    python benchmarks/results/k_policy_r23_tried/process_spread.py static|dynamic BATCH ROUNDS   # from the repository root
"""
import sys, statistics, json
from spdflow.bench import BatchBench, resolve_modes
from spdflow.engine.run import NullUI
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import load_recipe
mode, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pm = get_plugin_manager()
loaded = load_recipe("recipes/tinycode_varK.yaml", pm, ["workload.count=16", "proposer={uses: synthetic, with: {acceptance_rate: 0.6}}",
                                                         f"devices.with.session_mode={mode}"])
modes = {m.row: m for m in resolve_modes(pm, ["nospec", "fixed:all"], loaded.recipe)}
bench = BatchBench(pm, loaded, batch, NullUI()); bench.open(); bench.warm_up()
times = {}
for i in range(rounds):
    for row, m in modes.items():
        run = bench.run(m, i)
        k = int(row.split(":")[1]) if ":" in row else 0
        times.setdefault(k, []).extend(r["verify_s"] for r in run.records if r.get("kind") == "step")
bench.close()
print(json.dumps({"mode": mode, "verify_ms": {k: statistics.fmean(v) * 1e3 for k, v in sorted(times.items())}}))
