"""Replay record_calls.py's calls into a fresh Goodput from PLUGINS_DIR, check every decision equals the recorded one, time it warm:
    python benchmarks/results/k_policy_r24_tried/replay_calls.py plugins OUT.pkl ... [--profile]"""
import importlib.util, pickle, sys, time, cProfile, pstats
plugdir = sys.argv[1]
spec = importlib.util.spec_from_file_location("gp", f"{plugdir}/spdflow_decoding/goodput.py")
gp = importlib.util.module_from_spec(spec); spec.loader.exec_module(gp)
from spdflow.api import NoServices
prof = "--profile" in sys.argv
def run(calls):
    policy, bad, n = None, 0, 0
    for method, args, result in calls:
        if method == "start":
            policy = gp.Goodput(gp.GoodputConfig())
            policy.start(args[0], args[1], NoServices(args[2]))
            continue
        out = getattr(policy, method)(*args)
        if method in ("propose_budget", "choose_k"):
            n += 1
            if out != result:
                bad += 1
    return bad, n
for path in [a for a in sys.argv[2:] if not a.startswith("--")]:
    calls = pickle.load(open(path, "rb"))
    bad, n = run(calls)
    times = []
    for _ in range(7):
        t = time.perf_counter(); run(calls); times.append(time.perf_counter() - t)
    steps = sum(1 for c in calls if c[0] == "observe")
    print(f"{path.split('/')[-1]}: {n} decisions, {bad} differ; {sorted(times)[3] / steps * 1e6:.1f} us/step (warm, median of 7)")
    if prof:
        pr = cProfile.Profile(); pr.enable(); run(calls); pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
