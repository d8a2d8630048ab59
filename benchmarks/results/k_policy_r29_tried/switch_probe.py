"""Probe: does a change of K cost less when the static sessions do not each keep their own prepacked weights?"""
import os, sys, time, statistics
import numpy as np
VARIANT = os.environ.get("VARIANT", "base")
if VARIANT.startswith("shared"):
    sys.path.insert(0, "benchmarks/results/k_policy_r29_tried"); import share_patch
import spdflow_ort.session as S
orig = S.session_options
def patched(threads, *, shared=True):
    o = orig(threads, shared=shared)
    if VARIANT in ("noprepack", "shared_noprepack"):
        o.add_session_config_entry("session.disable_prepacking", "1")
    if "nopattern" in VARIANT: o.enable_mem_pattern = False
    if "noarena" in VARIANT: o.enable_cpu_mem_arena = False
    if "envalloc" in VARIANT: o.add_session_config_entry("session.use_env_allocators", "1")
    return o
S.session_options = patched
if "envalloc" in VARIANT:
    import onnxruntime as ort
    ort.create_and_register_allocator(ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT), None)
from spdflow.bench import BatchBench
from spdflow.engine.run import NullUI
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import load_recipe
pm = get_plugin_manager()
batch = int(os.environ.get("BATCH", "1"))
loaded = load_recipe("recipes/tinycode_varK.yaml", pm, [o for o in os.environ.get("SETS","").split(",") if o])
bench = BatchBench(pm, loaded, batch, NullUI()); bench.open()
def step(k):
    ids = np.full((batch, k + 1), 5, dtype=np.int64)
    pos = np.tile(np.arange(100, 101 + k, dtype=np.int64), (batch, 1))
    t = time.perf_counter()
    pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos, num_logits_to_keep=k + 1, batch_index=None)
    return time.perf_counter() - t
patterns = {
  "7 steady": [7]*40,
  "4 steady": [4]*40,
  "0 steady": [0]*40,
  "4/7 alternating": [4, 7]*20,
  "0/7 alternating": [0, 7]*20,
}
res = {n: [] for n in patterns}
for rnd in range(int(os.environ.get("ROUNDS", "15"))):
    for name, seq in patterns.items():
        for k in seq[:6]: step(k)  # settle into the pattern
        ts = [(k, step(k)) for k in seq]
        res[name].append(ts)
def med(name, k):
    return statistics.median(t for r in res[name] for kk, t in r if kk == k) * 1e3
print(f"variant {VARIANT} batch {batch}")
for k in (0, 4, 7):
    print(f"  K={k} steady {med(f'{k} steady', k):.3f} ms")
print(f"  4/7 alt: K=4 {med('4/7 alternating', 4):.3f} K=7 {med('4/7 alternating', 7):.3f}")
print(f"  0/7 alt: K=0 {med('0/7 alternating', 0):.3f} K=7 {med('0/7 alternating', 7):.3f}")
bench.close()
