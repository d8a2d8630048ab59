"""Round 27's finding F3: benchmarks/policy_time.py with the garbage collector timed.

Runs policy_time.py with the same arguments and prints, after each run, the collections of each generation and the
time they took (a gc.callbacks timer). From the repository root:
    python benchmarks/results/k_policy_r27_tried/gc_time.py recipes/tinycode_varK.yaml --batch 1 --repeats 4 \\
        --pin 7 --modes fixed:7,goodput,smallest_covering --set workload.count=16 --set workload.builtin=stdlib_tests"""
import collections
import gc
import sys
import time

sys.path.insert(0, "benchmarks")
import policy_time  # noqa: E402
from spdflow.bench import BatchBench  # noqa: E402

spent, count, started = collections.Counter(), collections.Counter(), [0.0]


def timer(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        spent[info["generation"]] += time.perf_counter() - started[0]
        count[info["generation"]] += 1


gc.callbacks.append(timer)
run = BatchBench.run


def timed_run(self, mode, repeat):
    before_spent, before_count = dict(spent), dict(count)
    out = run(self, mode, repeat)
    shown = ", ".join(f"gen{g} {count[g] - before_count.get(g, 0)} x {1e3 * (spent[g] - before_spent.get(g, 0)):.1f} ms"
                      for g in (0, 1, 2))
    print(f"collections in {mode.row}: {shown}", file=sys.stderr, flush=True)
    return out


BatchBench.run = timed_run
sys.exit(policy_time.main(sys.argv[1:]))
