"""Round 34: goodput's step-cost figures along a recording of its calls (round 24's record_calls.py), from the
repository root:
    python benchmarks/results/k_policy_r24_tried/record_calls.py 1 syn03_b1.pkl \
        --set 'proposer={uses: synthetic, with: {acceptance_rate: 0.3}}'
    python benchmarks/results/k_policy_r34_tried/b1_costs.py syn03_b1.pkl [FIELD=JSON ...]
prints, per generation, the runs of K it chose and, at a few steps, each K's verify and host ms."""
import itertools
import json
import sys

sys.path.insert(0, "benchmarks")
from recorded_calls import drive, load_calls, load_goodput  # noqa: E402

fields = dict((k, json.loads(v)) for k, v in (a.split("=", 1) for a in sys.argv[2:]))
chosen, step = {}, 0
for generation, method, args, _, out, policy in drive(load_calls(sys.argv[1]), load_goodput(), **fields):
    if method != "choose_k":
        continue
    chosen.setdefault(generation, []).append(out)
    step = len(chosen[generation])
    if step in (2, 30, 100, 268, 400):
        costs = policy.costs
        print(f"generation {generation} step {step}: verify ms", {k: round(v * 1e3, 3) for k, v in costs.verify_s.items()},
              "host ms", {k: round((v or 0) * 1e3, 3) for k, v in costs.host_s.items()})
for generation, ks in chosen.items():
    runs = " ".join(f"{k}x{len(list(steps))}" for k, steps in itertools.groupby(ks))
    print(f"generation {generation}: {len(ks)} steps; K x steps:", runs)
