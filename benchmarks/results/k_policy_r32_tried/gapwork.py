"""Does the host work between two verify runs slow the second one?  Blocks of verify runs at one shape,
each run preceded by one kind of gap work, the kinds rotating block by block (drift cancels).

kinds: none; spin (busy-wait T us); churn (build and drop small Python objects for T us);
goodput (one recorded step of goodput's calls, driven on a live policy).
"""
import sys, time, statistics, itertools, collections
import numpy as np
sys.path.insert(0, "benchmarks")
from recorded_calls import load_calls, load_goodput
from spdflow.api import NoServices
from spdflow.bench import BatchBench
from spdflow.engine.run import NullUI
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import load_recipe

recipe, batch, k, pkl, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
T = float(sys.argv[6]) * 1e-6 if len(sys.argv) > 6 else None
pm = get_plugin_manager()
loaded = load_recipe(recipe, pm, [])
bench = BatchBench(pm, loaded, batch, NullUI())
bench.open()
pad = bench.config.pad_token_id
ids = np.full((batch, k + 1), pad, dtype=np.int64)
pos = np.full((batch, k + 1), -1, dtype=np.int64)
clock = time.perf_counter

mod = load_goodput()
calls = load_calls(pkl)
steps = []  # per recorded step: the calls up to and including observe
current, start_args = [], None
for method, args, recorded in calls:
    if method == "start":
        start_args = args
        continue
    current.append((method, args))
    if method == "observe":
        steps.append((start_args, current))
        current = []
feed = itertools.cycle(steps)
policy, policy_start = None, None


def goodput_step():
    global policy, policy_start
    start_args, step = next(feed)
    if policy is None or start_args is not policy_start:
        policy = mod.Goodput(mod.GoodputConfig())
        policy.start(start_args[0], start_args[1], NoServices(start_args[2]))
        policy_start = start_args
    for method, args in step:
        getattr(policy, method)(*args)


def spin():
    end = clock() + T
    while clock() < end:
        pass


def churn():
    end = clock() + T
    keep = []
    while clock() < end:
        d = {i: [float(i), (i, i + 1)] for i in range(16)}
        keep.append(d)
    del keep


# measure goodput's own gap time first to set T
if T is None:
    took = []
    for _ in range(2000):
        t = clock(); goodput_step(); took.append(clock() - t)
    T = statistics.median(took)
print(f"T = {T * 1e6:.1f} us", flush=True)

kinds = {"none": None, "spin": spin, "churn": churn, "goodput": goodput_step}
times = collections.defaultdict(list)
gaps = collections.defaultdict(list)
order = list(kinds)
for r in range(rounds):
    for name in order[r % 4:] + order[: r % 4]:
        work = kinds[name]
        block = []
        for i in range(40):
            if work is not None:
                g = clock(); work(); gaps[name].append(clock() - g)
            t = clock()
            pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos, num_logits_to_keep=k + 1,
                                   batch_index=None)
            block.append(clock() - t)
        times[name].append(statistics.median(block[5:]))
bench.close()
base = times["none"]
print(f"batch {batch} K {k} rounds {rounds}")
for name in order:
    ratios = [a / b for a, b in zip(times[name], base)]
    print(f"{name:8s} verify median {statistics.median(times[name]) * 1e6:8.1f} us  paired/none {statistics.median(ratios):.4f}"
          f"  (q25 {np.quantile(ratios, .25):.4f} q75 {np.quantile(ratios, .75):.4f})"
          f"  gap {statistics.median(gaps[name]) * 1e6 if gaps[name] else 0:6.1f} us")
