"""Round 23 of issue 23: a verify run's time by its position after a change of shape, in alternating
blocks of 10 runs at K = 2 and K = 4 with a 0.2 ms spinning gap after each run.

    python benchmarks/results/k_policy_r23_tried/switch_tail.py BATCH BLOCKS   # from the repository root
"""
import sys, time, statistics
import numpy as np
from spdflow.bench import BatchBench
from spdflow.engine.run import NullUI
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import load_recipe
batch, blocks = int(sys.argv[1]), int(sys.argv[2])
pm = get_plugin_manager()
loaded = load_recipe("recipes/tinycode_varK.yaml", pm, ["workload.count=16"])
bench = BatchBench(pm, loaded, batch, NullUI()); bench.open(); bench.warm_up()
pad = bench.config.pad_token_id
by = {2: [[] for _ in range(10)], 4: [[] for _ in range(10)]}
for b in range(blocks):
    k = 2 if b % 2 else 4
    for i in range(10):
        ids = np.full((batch, k + 1), pad, dtype=np.int64); pos = np.full((batch, k + 1), -1, dtype=np.int64)
        s = time.perf_counter()
        pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos, num_logits_to_keep=k + 1, batch_index=None)
        e = time.perf_counter()
        by[k][i].append(e - s)
        while time.perf_counter() - e < 0.0002:
            pass
for k, pos in by.items():
    steady = statistics.median([t for p in pos[5:] for t in p])
    print(f"b{batch} K={k} steady {steady*1e3:.3f} ms; position after switch / steady:",
          " ".join(f"{statistics.median(p)/steady:.3f}" for p in pos))
bench.close()
