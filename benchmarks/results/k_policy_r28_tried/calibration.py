"""Round 28's F4: how goodput's expected extras of seven-token proposals compare with what scored proposals held.

Drives goodput on recorded calls (round 24's record_calls.py pickle); at every choose_k with a seven-token proposal
(once the estimate is settled) it takes the row's extra[4] and extra[7] four ways: goodput's own (the request's rate
times its grade's ratio), the pooled rate times the grade's ratio, the request's rate alone, the pooled rate alone;
and per grade the realized E[min(m, 4)] and E[min(m, 7)] over every scored proposal (m: tokens that held). From the
repository root:
    python benchmarks/results/k_policy_r28_tried/calibration.py RECORDING.pkl"""
import sys, collections, statistics
sys.path.insert(0, "benchmarks")
from recorded_calls import drive, load_calls, load_goodput
m = load_goodput("plugins/spdflow_decoding/goodput.py")
path = sys.argv[1]
calls = load_calls(path)
grade = None; ex = collections.defaultdict(list); real = collections.defaultdict(lambda: [0, 0.0, 0.0])
for gen, meth, args, rec, out, p in drive(calls, m):
    if meth == "see_grades": grade = tuple(args[0])
    if meth == "choose_k" and any(args[0]) and p._settled:
        a = p.acceptance
        rows = len(args[0])
        gr = p.row_grades(rows) or (None,) * rows
        cur = a.row_extras(p.requests, p.row_grades(rows))
        pooled_graded = a.row_extras([None] * rows, p.row_grades(rows))
        own_only = a.row_extras(p.requests, None)
        pooled = a.row_extras([None] * rows, None)
        for i, n in enumerate(args[0]):
            if n == 7:
                ex[gr[i]].append((cur[i][4], cur[i][7], pooled_graded[i][4], pooled_graded[i][7], own_only[i][4], own_only[i][7], pooled[i][4], pooled[i][7]))
    if meth == "observe":
        o = args[0]; gs = o.scored_grades
        for i, (c, mt) in enumerate(o.scored):
            g = gs[i] if i < len(gs) else None
            r = real[g]; r[0] += 1; r[1] += min(mt, 4); r[2] += min(mt, 7)
names = ("own x grade (goodput)", "pooled x grade", "own only", "pooled only")
for g in sorted(ex, key=str):
    v = ex[g]; n, e4, e7 = real[g]
    print(f"grade {g}: {len(v)} seven-token choices; realized over {n} scored: E4 {e4/n:.2f} E7 {e7/n:.2f}")
    for j, name in enumerate(names):
        print(f"   {name}: E4 {statistics.mean(x[2*j] for x in v):.2f} E7 {statistics.mean(x[2*j+1] for x in v):.2f}")
