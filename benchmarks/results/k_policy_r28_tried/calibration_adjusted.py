"""Round 28's F4, offline: the rate R7's grade_own then built into goodput, computed beside goodput's own.

Drives goodput on recorded calls and keeps each request's own scored proposals per grade; at every seven-token
choice of a graded row, its rate at position j is its grade's rate times (H_j + W) / (X_j + W): H_j the request's
proposals that held to j, X_j the holds its proposals' grades predicted, W pseudo-holds (argument 2, default 2).
Prints per grade the realized E[min(m, 4)] and E[min(m, 7)], goodput's and this rate's. From the repository root:
    python benchmarks/results/k_policy_r28_tried/calibration_adjusted.py RECORDING.pkl [W]"""
import sys, collections, statistics
sys.path.insert(0, "benchmarks")
from recorded_calls import drive, load_calls, load_goodput
m = load_goodput("plugins/spdflow_decoding/goodput.py")
W = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
calls = load_calls(sys.argv[1])
hist = {}  # (gen, request, grade) -> (tried[8], held[8]) exact-position histograms
grade = None; ex = collections.defaultdict(list); real = collections.defaultdict(lambda: [0, 0.0, 0.0])
def tails(h):
    out, t = [0.0] * len(h), 0.0
    for j in range(len(h) - 1, 0, -1):
        t += h[j]; out[j] = t
    return out
def running(rates):
    e, run = [0.0], 1.0
    for r in rates[1:]:
        run *= r; e.append(e[-1] + run)
    return e
for gen, meth, args, rec, out, p in drive(calls, m):
    if meth == "choose_k" and any(args[0]) and p._settled:
        a = p.acceptance; rows = len(args[0]); gr = p.row_grades(rows) or (None,) * rows
        cur = a.row_extras(p.requests, p.row_grades(rows))
        a.expected_extra(); pooled = a._rates
        for i, n in enumerate(args[0]):
            if n != 7 or gr[i] is None: continue
            r = p.requests[i] if i < len(p.requests) else None
            def phat(g):
                ratio = a._graded_rates(None, g)
                return [1.0] + [pooled[j] * ratio[j] for j in range(1, len(pooled))]
            X = [0.0] * len(pooled); H = [0.0] * len(pooled)
            for (gg, rr, g2), (tr, hd) in hist.items():
                if gg != gen or rr != r: continue
                T, Hh, ph = tails(tr), tails(hd), phat(g2)
                for j in range(1, len(pooled)):
                    X[j] += T[j] * ph[j]; H[j] += Hh[j]
            mine = phat(gr[i])
            rate = [1.0] + [min(0.995, mine[j] * (H[j] + W) / (X[j] + W)) for j in range(1, len(pooled))]
            e = running(rate)
            ex[gr[i]].append((cur[i][4], cur[i][7], e[4], e[7]))
    if meth == "observe":
        o = args[0]; gs = o.scored_grades
        for i, (c, mt) in enumerate(o.scored):
            g = gs[i] if i < len(gs) else None
            rr = real[g]; rr[0] += 1; rr[1] += min(mt, 4); rr[2] += min(mt, 7)
            if i < len(o.scored_requests) and g is not None:
                h = hist.setdefault((gen, o.scored_requests[i], g), ([0] * 8, [0] * 8))
                h[0][c] += 1; h[1][mt] += 1
for g in sorted(ex, key=str):
    v = ex[g]; n, e4, e7 = real[g]
    print(f"grade {g}: {len(v)} choices; realized E4 {e4/n:.2f} E7 {e7/n:.2f} | goodput E4 {statistics.mean(x[0] for x in v):.2f} E7 {statistics.mean(x[1] for x in v):.2f} | grade-adjusted own E4 {statistics.mean(x[2] for x in v):.2f} E7 {statistics.mean(x[3] for x in v):.2f}")
