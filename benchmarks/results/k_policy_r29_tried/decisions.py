"""Round 29: goodput's recorded calls driven again with GoodputConfig fields (e.g. split_host=true), counting its
choose_k answers by K and its proposer budgets of 0 against the recorded ones (after the first differing decision the
drive leaves the recorded path, so the counts are indicative). From the repository root:
    python benchmarks/results/k_policy_r29_tried/decisions.py split_host=true CALLS.pkl ..."""
import sys, collections
sys.path.insert(0, "benchmarks")
from recorded_calls import load_calls, load_goodput, drive
mod = load_goodput()
fields = dict(f.split("=") for f in sys.argv[1].split(",")) if sys.argv[1] else {}
fields = {k: (v == "true") if v in ("true", "false") else float(v) for k, v in fields.items()}
for p in sys.argv[2:]:
    calls = load_calls(p)
    rec, now = collections.Counter(), collections.Counter(); skip_rec = skip_now = diff = 0
    for gen, method, args, recorded, out, pol in drive(calls, mod, **fields):
        if method == "choose_k":
            rec[recorded] += 1; now[out] += 1; diff += recorded != out
        if method == "propose_budget":
            skip_rec += recorded == 0; skip_now += out == 0
    print(f"{p.split('/')[-1]:12s} choose_k recorded {dict(sorted(rec.items()))} now {dict(sorted(now.items()))} differ {diff}; budget 0: {skip_rec} -> {skip_now}")
