"""Replay goodput's recorded calls (round 24's record_calls.py) into a fresh Goodput, check each decision equals the
recorded one, and print its state at every step where the proposer budget turns to 0 (skipping) or back.
From the repository root (round 25's finding F2, code at batch 4):
    python benchmarks/results/k_policy_r24_tried/record_calls.py 4 OUT.pkl
    python benchmarks/results/k_policy_r25_tried/skip_trace.py OUT.pkl"""
import importlib.util
import pickle
import sys

spec = importlib.util.spec_from_file_location("gp", "plugins/spdflow_decoding/goodput.py")
gp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gp)
from spdflow.api import NoServices  # noqa: E402

policy, step, prev = None, 0, None
for method, args, result in pickle.load(open(sys.argv[1], "rb")):
    if method == "start":
        policy = gp.Goodput(gp.GoodputConfig())
        policy.start(args[0], args[1], NoServices(args[2]))
        step, prev, shown = 0, None, 0
        print("=== run; grid ms", {k: round(v * 1e3, 3) for k, v in args[2].items()})
        continue
    out = getattr(policy, method)(*args)
    assert out == result or method not in ("propose_budget", "choose_k"), "a decision differs from the recorded one"
    if method != "propose_budget":
        continue
    step += 1
    if (out == 0) != (prev == 0) and shown < 14:
        c, acc = policy.costs, policy.acceptance
        rates = policy.rates([policy.ks[-1]] * len(policy.left), c.propose_s or 0.0, policy.row_weights(),
                             share=acc.yield_rate, budget=True)
        ms = lambda d: "{" + ", ".join(f"{k}:{(v or 0) * 1e3:.2f}" for k, v in d.items()) + "}"  # noqa: E731
        print(f"step {step} budget {prev}->{out} last_k {c.last_k} verify {ms(c.verify_s)} host {ms(c.host_s)} "
              f"penalty {c.penalty_s * 1e3:.2f} yield {acc.yield_rate:.2f} extra[1..3] "
              f"{[round(x, 2) for x in acc.expected_extra()[1:4]]} last outcomes {[acc.last.get(q) for q in policy.requests]} "
              f"budget rates {{{', '.join(f'{k}:{v:.0f}' for k, v in rates.items())}}} unlearned {sorted(c.unlearned)}")
        shown += 1
    prev = out
