"""Round 27's rule R1: two goodput.py files driven alternately on recorded calls (round 24's record_calls.py).

Per pickle: the median over 7 alternations of each file's time per step (all methods, driven alone, so without the
cold caches of a generation), and how many of the new file's decisions differ from the recorded ones. From the
repository root:
    git show HEAD:plugins/spdflow_decoding/goodput.py > OLD.py
    python benchmarks/results/k_policy_r27_tried/ab_drive.py OLD.py plugins/spdflow_decoding/goodput.py A.pkl B.pkl"""
import statistics
import sys
import time

sys.path.insert(0, "benchmarks")
from recorded_calls import drive, load_calls, load_goodput  # noqa: E402

old, new = load_goodput(sys.argv[1], "goodput_old"), load_goodput(sys.argv[2], "goodput_new")
for path in sys.argv[3:]:
    calls = load_calls(path)
    steps = sum(1 for call in calls if call[0] == "choose_k")
    times, differing = {old: [], new: []}, 0
    for turn in range(7):
        for module in ((old, new) if turn % 2 else (new, old)):
            started = time.perf_counter()
            for _, method, _, recorded, out, _ in drive(calls, module):
                differing += module is new and method in ("propose_budget", "choose_k") and out != recorded
            times[module].append((time.perf_counter() - started) / steps * 1e6)
    o, n = statistics.median(times[old]), statistics.median(times[new])
    print(f"{path}: old {o:.1f} us/step, new {n:.1f} (x{n / o:.2f}); new decisions differing: {differing}")
