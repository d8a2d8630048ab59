"""Round 27's finding F2: how each request's scored proposals fared early and late in a recorded run.

For each recorded run (round 24's record_calls.py) and request: over steps 1-39, 40-79 and 80 on, the scored
proposals, the share whose first token held, and the mean tokens held. From the repository root:
    python benchmarks/results/k_policy_r27_tried/request_phases.py OUT.pkl"""
import collections
import sys

sys.path.insert(0, "benchmarks")
from recorded_calls import load_calls  # noqa: E402

runs, run, step = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0, 0])), 0, 0
for method, args, _ in load_calls(sys.argv[1]):
    if method == "start":
        run, step = run + 1, 0
    elif method == "observe":
        step += 1
        outcome = args[0]
        for request, (checked, matched) in zip(outcome.scored_requests, outcome.scored):
            figures = runs[(run, request)][0 if step < 40 else 1 if step < 80 else 2]
            figures[0] += 1
            figures[1] += matched >= 1
            figures[2] += matched
for (run, request), phases in sorted(runs.items()):
    shown = ", ".join(f"{('1-39', '40-79', '80-')[p]}: {n} held first {first / n:.2f} mean {held / n:.2f}"
                      for p, (n, first, held) in sorted(phases.items()))
    print(f"run {run} request {request}: {shown}")
