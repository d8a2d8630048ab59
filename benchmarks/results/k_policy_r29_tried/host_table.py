"""Round 29: host time per step in goodput's recorded calls, by K, by whether the proposer ran, and by the step's
place (the generation's first step, the first after a change of K, the others). From the repository root:
    python benchmarks/results/k_policy_r29_tried/host_table.py CALLS.pkl ...   (record_calls.py of round 24)"""
import statistics
import sys

sys.path.insert(0, "benchmarks")
from recorded_calls import load_calls  # noqa: E402

for path in sys.argv[1:]:
    per, previous, index = {}, None, 0
    for method, args, _ in load_calls(path):
        if method == "start":
            previous, index = None, 0
            continue
        if method == "observe":
            outcome, index = args[0], index + 1
            place = "first" if index == 1 else ("switch" if outcome.k != previous else "same")
            key = (outcome.k, "proposer" if outcome.propose_s > 0 else "none", place)
            per.setdefault(key, []).append(outcome.host_s * 1e3)
            previous = outcome.k
    print(path)
    for key, values in sorted(per.items()):
        print(f"   K={key[0]} proposer {key[1]:8s} {key[2]:6s}: {len(values):5d} steps, median {statistics.median(values):.3f} ms")
