"""Two goodput.py files driven alternately on recorded calls, the caches flushed before each observe (as a verify
run does live); per file µs per step (median of 7 alternations) and new decisions differing from the recorded."""
import statistics, sys, time
from collections import defaultdict
import numpy as np
sys.path.insert(0, "benchmarks")
from recorded_calls import load_calls, load_goodput
from spdflow.api import NoServices
FLUSH = np.ones(16 * 2**20 // 8)
def run(mod, calls):
    t = defaultdict(float); n = 0; differing = 0; policy = None
    for method, args, recorded in calls:
        if method == "start":
            policy = mod.Goodput(mod.GoodputConfig()); policy.start(args[0], args[1], NoServices(args[2])); continue
        if method == "observe":
            FLUSH.sum()
        f = getattr(policy, method)
        t0 = time.perf_counter(); out = f(*args); t[method] += time.perf_counter() - t0
        n += method == "choose_k"
        differing += method in ("propose_budget", "choose_k") and out != recorded
    return {m: v / n * 1e6 for m, v in t.items()}, differing
old, new = load_goodput(sys.argv[1], "goodput_old"), load_goodput(sys.argv[2], "goodput_new")
tot = {}
for path in sys.argv[3:]:
    calls = load_calls(path)
    res = {old: [], new: []}; diff = 0
    for turn in range(7):
        for mod in ((old, new) if turn % 2 else (new, old)):
            r, d = run(mod, calls); res[mod].append(r); diff += d * (mod is new)
    med = {m: statistics.median(sum(r.values()) for r in res[m]) for m in (old, new)}
    per = {m: {k: round(statistics.median(r[k] for r in res[m]), 1) for k in res[m][0]} for m in (old, new)}
    print(f"{path.split('/')[-1]:12s} old {med[old]:5.1f} new {med[new]:5.1f} us/step (x{med[new]/med[old]:.2f}) differing {diff}"
          f"  old {per[old]}  new {per[new]}")
