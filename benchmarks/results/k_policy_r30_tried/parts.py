"""Cold-driven: µs a step in choose_k's parts (row_weights, row_extras, _extra_of misses, rest of rates, best)."""
import sys, time, collections
import numpy as np
sys.path.insert(0, "benchmarks")
from recorded_calls import load_calls, load_goodput
from spdflow.api import NoServices
mod = load_goodput(sys.argv[1])
FLUSH = np.ones(16 * 2**20 // 8)
T = collections.defaultdict(float)
def timed(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: T[label] += time.perf_counter() - t
    setattr(obj, name, g)
for path in sys.argv[2:]:
    T.clear(); steps = 0
    for method, args, recorded in load_calls(path):
        if method == "start":
            p = mod.Goodput(mod.GoodputConfig()); p.start(args[0], args[1], NoServices(args[2]))
            for name in ("rates", "best", "row_weights", "count_pending", "_extra_of" if False else "row_weights"):
                timed(p, name, name)
            timed(p.acceptance, "row_extras", "row_extras"); timed(p.acceptance, "_extra_of", "_extra_of")
            timed(p.acceptance, "note_outcomes", "note_outcomes")
            continue
        if method == "observe": FLUSH.sum()
        t = time.perf_counter(); getattr(p, method)(*args); T["method:" + method] += time.perf_counter() - t
        steps += method == "choose_k"
    print(path.split("/")[-1], {k: round(v / steps * 1e6, 1) for k, v in sorted(T.items())})
