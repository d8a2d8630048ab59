"""Grid-style timing vs decode-like inputs: K=2 / K=0 verify ratio at batch B, positions -1 vs real, with/without a host gap."""
import os, sys, time, statistics
import numpy as np
from spdflow.bench import BatchBench
from spdflow.engine.run import NullUI
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import load_recipe
pm = get_plugin_manager()
batch = int(sys.argv[1])
loaded = load_recipe("recipes/tinycode_varK.yaml", pm, [])
bench = BatchBench(pm, loaded, batch, NullUI()); bench.open()
FLUSH = np.ones(4 * 2**20 // 8)
def step(k, real, gap):
    ids = np.full((batch, k + 1), 5, dtype=np.int64)
    pos = (np.tile(np.arange(150, 151 + k, dtype=np.int64), (batch, 1)) if real else np.full((batch, k + 1), -1, dtype=np.int64))
    t = time.perf_counter()
    pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos, num_logits_to_keep=k + 1, batch_index=None)
    e = time.perf_counter() - t
    if gap == "busy":
        end = time.perf_counter()
        while time.perf_counter() - end < 2e-4: pass
    elif gap == "flush":
        FLUSH.sum()
    return e
res = {}
for rnd in range(12):
    for real in (False, True):
        for gap in ("none", "busy", "flush"):
            for k in (0, 2, 7):
                for _ in range(4): step(k, real, gap)
                res.setdefault((real, gap, k), []).extend(step(k, real, gap) for _ in range(6))
for real in (False, True):
    for gap in ("none", "busy", "flush"):
        m = {k: statistics.median(res[(real, gap, k)]) * 1e3 for k in (0, 2, 7)}
        print(f"b{batch} positions {'real' if real else '-1  '} gap {gap:5s}: K0 {m[0]:.3f} K2 {m[2]:.3f} K7 {m[7]:.3f}  K2/K0 {m[2]/m[0]:.3f} K7/K0 {m[7]/m[0]:.3f}")
