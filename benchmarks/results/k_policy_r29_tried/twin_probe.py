"""Probe: two InferenceSessions of the SAME K=7 graph, alternated: does a change of session cost what a change of K does?"""
import os, sys, time, statistics
import numpy as np
if os.environ.get("SHARE"):
    sys.path.insert(0, "benchmarks/results/k_policy_r29_tried"); import share_patch
import onnxruntime as ort
import spdflow_ort.session as S
from spdflow.bench import BatchBench
from spdflow.engine.run import NullUI
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import load_recipe
if os.environ.get("NOPREPACK"):
    _o = S.session_options
    def _p(t, *, shared=True):
        o = _o(t, shared=shared); o.add_session_config_entry("session.disable_prepacking", "1"); return o
    S.session_options = _p
V = os.environ.get("V", "")
if "envalloc" in V:
    ort.create_and_register_allocator(ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT), None)
_o2 = S.session_options
def _p2(t, *, shared=True):
    o = _o2(t, shared=shared)
    if "envalloc" in V: o.add_session_config_entry("session.use_env_allocators", "1")
    if "nopattern" in V: o.enable_mem_pattern = False
    return o
S.session_options = _p2
pm = get_plugin_manager()
loaded = load_recipe("recipes/tinycode_varK.yaml", pm, [])
bench = BatchBench(pm, loaded, 1, NullUI()); bench.open()
sess = bench.session
while not isinstance(sess, S.OrtSession):
    sess = getattr(sess, "inner", None) or getattr(sess, "session", None) or getattr(sess, "_session")
key7 = [k for k in sess._shapes if k[1] == 8][0]
shape7 = sess._shapes[key7]
entry = [g for g in sess.manifest["graphs"] if g.get("k") == 7][0]
twin_session = ort.InferenceSession(str(sess.program_dir / entry["file"]), S.session_options(None), providers=["CPUExecutionProvider"])
twin = sess._bind(shape7.spec, twin_session)
def step(k, which=None):
    if which is not None: sess._shapes[key7] = which
    ids = np.full((1, k + 1), 5, dtype=np.int64)
    pos = np.tile(np.arange(100, 101 + k, dtype=np.int64), (1, 1))
    t = time.perf_counter()
    pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos, num_logits_to_keep=k + 1, batch_index=None)
    return time.perf_counter() - t
pats = {"7 steady": [(7, shape7)] * 40, "7 twin alternating": [(7, shape7), (7, twin)] * 20,
        "0/7 alternating": [(0, None), (7, shape7)] * 20, "4/7 alternating": [(4, None), (7, shape7)] * 20}
res = {n: [] for n in pats}
for rnd in range(15):
    for name, seq in pats.items():
        for k, w in seq[:6]: step(k, w)
        res[name] += [(k, step(k, w)) for k, w in seq]
for name in pats:
    for k in sorted({k for k, _ in res[name]}):
        print(f"{name:20s} K={k}: {statistics.median(t for kk, t in res[name] if kk == k) * 1e3:.3f} ms")
