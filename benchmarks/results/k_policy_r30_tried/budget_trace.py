"""At each budget pricing in a recording: the priced rates, the cost model's figures, the pooled extras."""
import sys
sys.path.insert(0, "benchmarks")
from recorded_calls import load_calls, load_goodput
from spdflow.api import NoServices
mod = load_goodput()
path = sys.argv[1]; every = int(sys.argv[2]) if len(sys.argv) > 2 else 10
calls = load_calls(path)
gen = 0; step = 0
for method, args, recorded in calls:
    if method == "start":
        gen += 1; step = 0
        policy = mod.Goodput(mod.GoodputConfig()); policy.start(args[0], args[1], NoServices(args[2]))
        print(f"== gen {gen} grid", {k: round(v * 1e3, 3) for k, v in args[2].items()} if isinstance(args[2], dict) else args[2])
        orig_rates = policy.rates
        def rates(*a, orig=orig_rates, **kw):
            out = orig(*a, **kw)
            if kw.get("budget") and step % every == 0:
                c = policy.costs
                print(f"  step {step:4d} last {c.last_k} share {kw.get('share'):.2f} rates", {k: round(v) for k, v in out.items()},
                      "verify", {k: round(v * 1e3, 3) for k, v in c.verify_s.items()},
                      "host", {k: round((v or 0) * 1e3, 3) for k, v in c.host_s.items()},
                      f"prop {(c.propose_s or 0)*1e3:.3f} pen {c.penalty_s*1e3:.3f}",
                      "extra", [round(x, 2) for x in policy.acceptance.expected_extra()], "w", [round(w, 2) for w in (a[2] or [])])
            return out
        policy.rates = rates
        continue
    if method == "propose_budget": step += 1
    getattr(policy, method)(*args)
