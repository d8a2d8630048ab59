"""ORT's profile of the K = 7 session run alone (steady) or alternated with a second session of the same graph
(twin): per op kind, the median node time. Writes nodes_<mode>.json in the working directory; from the
repository root: python benchmarks/results/k_policy_r29_tried/twin_prof.py steady (then twin)."""
import os, sys, time, json, statistics, glob, tempfile
from collections import defaultdict
import numpy as np
import onnxruntime as ort
import spdflow_ort.session as S
MODE = sys.argv[1]  # steady | twin
_o = S.session_options
def _p(t, *, shared=True):
    o = _o(t, shared=shared); o.enable_profiling = True; o.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"prof_{MODE}"); return o
S.session_options = _p
from spdflow.bench import BatchBench
from spdflow.engine.run import NullUI
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import load_recipe
pm = get_plugin_manager()
loaded = load_recipe("recipes/tinycode_varK.yaml", pm, [])
bench = BatchBench(pm, loaded, 1, NullUI()); bench.open()
sess = bench.session
while not isinstance(sess, S.OrtSession):
    sess = getattr(sess, "inner", None) or getattr(sess, "session", None) or getattr(sess, "_session")
key7 = [k for k in sess._shapes if k[1] == 8][0]
shape7 = sess._shapes[key7]
entry = [g for g in sess.manifest["graphs"] if g.get("k") == 7][0]
o = _o(None); 
twin = sess._bind(shape7.spec, ort.InferenceSession(str(sess.program_dir / entry["file"]), o, providers=["CPUExecutionProvider"]))
ids = np.full((1, 8), 5, dtype=np.int64); pos = np.arange(100, 108, dtype=np.int64)[None]
ts = []
for i in range(600):
    if MODE == "twin": sess._shapes[key7] = twin if i % 2 else shape7
    t = time.perf_counter()
    pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos, num_logits_to_keep=8, batch_index=None)
    if MODE == "steady" or i % 2 == 0: ts.append(time.perf_counter() - t)
print(MODE, "median step of the profiled K=7 session %.3f ms" % (statistics.median(ts[50:]) * 1e3))
f = shape7.session.end_profiling()
ev = json.load(open(f))
nodes = defaultdict(list); runs = []
for e in ev:
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
        nodes[(e["name"][:-12], e["args"].get("op_name"))].append(e["dur"])
    if e.get("cat") == "Session" and e["name"] == "model_run":
        runs.append(e["dur"])
out = {f"{n}|{op}": statistics.median(d[50:]) for (n, op), d in nodes.items() if len(d) > 60}
out["__model_run"] = statistics.median(runs[50:])
json.dump(out, open(f"nodes_{MODE}.json", "w"))
for f in glob.glob(os.path.join(tempfile.gettempdir(), f"prof_{MODE}*.json")): os.remove(f)
