"""Round 27's finding F2: goodput's proposer budget at chosen steps of a recorded run, and what it rests on.

Replays goodput's recorded calls (round 24's record_calls.py) into a fresh Goodput with the given GoodputConfig
fields, and at each step named prints the rows' tokens left and weights, each row's own extra[2], [4], [7], and the
budget's rates three ways: as priced (row weights), unweighted, and without the proposer's time. From the
repository root:
    python benchmarks/results/k_policy_r24_tried/record_calls.py 8 OUT.pkl
    python benchmarks/results/k_policy_r27_tried/budget_trace.py OUT.pkl RUN STEPS [KEY=VALUE ...]
e.g. `OUT.pkl 2 24,49,69 request_decay=0.9` (RUN: which recorded generation, from 1; STEPS count its propose_budget
calls; KEY=VALUE: GoodputConfig fields, JSON values).)"""
import json
import sys

sys.path.insert(0, "benchmarks")
from recorded_calls import drive, load_calls, load_goodput  # noqa: E402

path, which, steps = sys.argv[1], int(sys.argv[2]), {int(s) for s in sys.argv[3].split(",")}
fields = {k: json.loads(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
step = 0
for generation, method, args, _, out, policy in drive(load_calls(path), load_goodput(), **fields):
    if method != "propose_budget" or generation != which:
        continue
    step += 1
    if step not in steps:
        continue
    c, a = policy.costs, policy.acceptance
    full, weights = [policy.ks[-1]] * len(policy.left), policy.row_weights()
    print(f"step {step}: budget {out}; left {policy.left}; weights {[round(w, 2) for w in weights or []]}")
    print(f"  propose {c.propose_s * 1e3:.3f} ms, run_on {policy.run_on():.2f}, yield {a.yield_rate:.2f}, "
          f"penalty {c.penalty_s * 1e3:.2f} ms, last K {c.last_k}")
    extras = a.row_extras(policy.requests, None, False)
    print("  each row's extra[2], [4], [7]:", [(round(e[2], 2), round(e[4], 2), round(e[7], 2)) for e in extras])
    for label, w, p in (("as priced", weights, c.propose_s), ("unweighted", None, c.propose_s),
                        ("no proposer time", weights, 0.0)):
        rates = policy.rates(full, p, w, share=a.yield_rate, budget=True)
        print(f"  budget rates, {label}:", {k: round(v) for k, v in rates.items()})
