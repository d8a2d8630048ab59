"""Round 29's rule R1: one bench, priced twice: every K at the mean host time of every step (before) and each K
from the static runs (now); goodput's priced regret each way beside its measured paired ratio."""
import json, statistics, sys
import spdflow.oracle as O
import spdflow.bench as B
captured = []
real = O.trace_oracle
def old_overheads(traces, ks, static=None):
    steps = [s for records in traces for s in O._steps(records)]
    host = statistics.fmean(float(s.get("host_s", 0.0)) for s in steps)
    drafting = [float(s["propose_s"]) for s in steps if float(s.get("propose_s", 0.0)) > 0]
    propose = statistics.fmean(drafting) if drafting else 0.0
    return {k: host + (propose if k else 0.0) for k in ks}
def wrapped(*args, **kwargs):
    new = real(*args, **kwargs)
    keep = O.step_overheads
    O.step_overheads = old_overheads
    try:
        old = real(*args, **{**kwargs, "static": None})
    finally:
        O.step_overheads = keep
    old.prices.zero_drafting = None  # before: a K = 0 step cost the same whether its proposer ran
    captured.append((old, new))
    return new
O.trace_oracle = wrapped
orig_runs = B.BatchBench.run
runs = []
def run(self, mode, repeat):
    r = orig_runs(self, mode, repeat); runs.append(r); return r
B.BatchBench.run = run
from spdflow.cli import main
sys.argv = ["spdflow", "bench", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
old, new = captured[-1]
by_mode = {}
for r in runs:
    by_mode.setdefault(r.mode, []).append(r)
ref_name = max(["nospec"] + [m for m in by_mode if m.startswith("fixed:")],
               key=lambda m: statistics.median(r.metrics.e2e_tokens_per_s for r in by_mode[m]))
print(f"best static by median tok/s: {ref_name}; priced best static before: {old.best_static}, now: {new.best_static}")
print("overheads ms before:", {k: round((v - old.cost.verify_s(old.cost.batch, k)) * 1e3, 3) for k, v in old.prices.step.items()})
print("overheads ms now:   ", {k: round((v - new.cost.verify_s(new.cost.batch, k)) * 1e3, 3) for k, v in new.prices.step.items()})
for m, rs in by_mode.items():
    if not m.startswith("varK:"):
        continue
    paired = statistics.median(a.metrics.e2e_tokens_per_s / b.metrics.e2e_tokens_per_s for a, b in zip(rs, by_mode[ref_name]))
    o = statistics.median(old.against(r.records)["regret_vs_best_static"] for r in rs)
    n = statistics.median(new.against(r.records)["regret_vs_best_static"] for r in rs)
    print(f"{m}: measured paired / {ref_name} {paired:.3f}; priced regret before {o * 100:+.1f} %, now {n * 100:+.1f} %")
