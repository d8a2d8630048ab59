"""Round 29: two InferenceSessions of the SAME K = 7 graph, alternated: does a change of session cost what a change
of K does? From the repository root:
    python benchmarks/results/k_policy_r29_tried/twin_probe.py            # the timing probe (batch 1)
    SHARE=1 NOPREPACK=1 python .../twin_probe.py                          # one shared, unpacked copy of the weights
    V=envalloc,nopattern python .../twin_probe.py                         # one arena for every session
    python .../twin_probe.py --profile steady; python .../twin_probe.py --profile twin; python .../twin_probe.py --compare
The --profile runs write ORT's per-node median times to nodes_<mode>.json in the working directory; --compare sums
them per op kind (steady: the K = 7 session alone; twin: alternated with its twin)."""
import glob, json, os, statistics, sys, tempfile, time
from collections import defaultdict

import numpy as np

PROFILE = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--profile" else None


def compare():
    a, b = json.load(open("nodes_steady.json")), json.load(open("nodes_twin.json"))
    print("model_run µs", a.pop("__model_run"), b.pop("__model_run"))
    by_op = defaultdict(lambda: [0.0, 0.0])
    for key in a.keys() & b.keys():
        by_op[key.split("|")[1]][0] += a[key]
        by_op[key.split("|")[1]][1] += b[key]
    for op, (x, y) in sorted(by_op.items(), key=lambda kv: kv[1][0] - kv[1][1]):
        print(f"{op:28s} steady {x:7.0f} µs  twin {y:7.0f} µs  {y - x:+6.0f}")


def open_twin():
    """The batch-1 bench session of recipes/tinycode_varK.yaml with a second session of its K = 7 graph bound beside."""
    if os.environ.get("SHARE"):
        sys.path.insert(0, "benchmarks/results/k_policy_r29_tried")
        import share_patch  # noqa: F401
    import onnxruntime as ort
    import spdflow_ort.session as S
    from spdflow.bench import BatchBench
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    variant, plain = os.environ.get("V", ""), S.session_options
    if "envalloc" in variant:
        ort.create_and_register_allocator(ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                                            ort.OrtMemType.DEFAULT), None)

    def options(threads, *, shared=True):
        o = plain(threads, shared=shared)
        if os.environ.get("NOPREPACK"):
            o.add_session_config_entry("session.disable_prepacking", "1")
        if "envalloc" in variant:
            o.add_session_config_entry("session.use_env_allocators", "1")
        if "nopattern" in variant:
            o.enable_mem_pattern = False
        if PROFILE:
            o.enable_profiling = True
            o.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"prof_{PROFILE}")
        return o

    S.session_options = options
    pm = get_plugin_manager()
    bench = BatchBench(pm, load_recipe("recipes/tinycode_varK.yaml", pm, []), 1, NullUI())
    bench.open()
    sess = bench.session
    while not isinstance(sess, S.OrtSession):
        sess = getattr(sess, "inner", None) or getattr(sess, "session", None) or getattr(sess, "_session")
    key7 = [k for k in sess._shapes if k[1] == 8][0]
    shape7 = sess._shapes[key7]
    entry = [g for g in sess.manifest["graphs"] if g.get("k") == 7][0]
    twin_session = ort.InferenceSession(str(sess.program_dir / entry["file"]), plain(None), providers=["CPUExecutionProvider"])
    return pm, bench, sess, key7, shape7, sess._bind(shape7.spec, twin_session)


def main():
    pm, bench, sess, key7, shape7, twin = open_twin()

    def step(k, which=None):
        if which is not None:
            sess._shapes[key7] = which
        ids = np.full((1, k + 1), 5, dtype=np.int64)
        pos = np.arange(100, 101 + k, dtype=np.int64)[None]
        t = time.perf_counter()
        pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos, num_logits_to_keep=k + 1,
                               batch_index=None)
        return time.perf_counter() - t

    if PROFILE:  # 600 runs of the K = 7 session, alone or every other one on its twin
        times = [step(7, twin if PROFILE == "twin" and i % 2 else shape7) for i in range(600)]
        print(PROFILE, "median step %.3f ms" % (statistics.median(times[50:]) * 1e3))
        events = json.load(open(shape7.session.end_profiling()))
        nodes, runs = defaultdict(list), []
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                nodes[(e["name"][:-12], e["args"].get("op_name"))].append(e["dur"])
            if e.get("cat") == "Session" and e["name"] == "model_run":
                runs.append(e["dur"])
        out = {f"{n}|{op}": statistics.median(d[50:]) for (n, op), d in nodes.items() if len(d) > 60}
        out["__model_run"] = statistics.median(runs[50:])
        json.dump(out, open(f"nodes_{PROFILE}.json", "w"))
        for f in glob.glob(os.path.join(tempfile.gettempdir(), f"prof_{PROFILE}*.json")):
            os.remove(f)
        return
    patterns = {"7 steady": [(7, shape7)] * 40, "7 twin alternating": [(7, shape7), (7, twin)] * 20,
                "0/7 alternating": [(0, None), (7, shape7)] * 20, "4/7 alternating": [(4, None), (7, shape7)] * 20}
    results = {n: [] for n in patterns}
    for _ in range(15):
        for name, seq in patterns.items():
            for k, w in seq[:6]:
                step(k, w)
            results[name] += [(k, step(k, w)) for k, w in seq]
    for name in patterns:
        for k in sorted({k for k, _ in results[name]}):
            print(f"{name:20s} K={k}: {statistics.median(t for kk, t in results[name] if kk == k) * 1e3:.3f} ms")


if __name__ == "__main__":
    compare() if sys.argv[1:2] == ["--compare"] else main()
