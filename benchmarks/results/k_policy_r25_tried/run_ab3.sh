#!/bin/bash
# round 25 budget-without-outcomes A/B: 2 processes round-robin over 3 prompt-lookup workloads, batch 4 and 8, 4 repeats
cd "$(git rev-parse --show-toplevel)"   # needs GOODPUT_VARIANT (see the harness); writes to $OUT
OUT=${OUT:-ab_out}; mkdir -p "$OUT"
. .venv/bin/activate
for p in 1 2; do
  for w in code stdlib thirdparty; do
    case $w in
      code) extra=();;
      stdlib) extra=(--set workload.builtin=stdlib_tests);;
      thirdparty) extra=(--set workload.builtin=thirdparty);;
    esac
    start=$(date +%s)
    echo "== $w.p$p $(date -u +%H:%M:%S) $(uptime)" >> $OUT/nooutcome_runs.log
    nice -n -20 python benchmarks/results/k_policy_r25_tried/ab_nooutcome.py bench recipes/tinycode_varK.yaml --batch-sizes 4,8 \
      --modes nospec,fixed:all,goodput,goodput_nooutcome --repeats 4 --json $OUT/nooutcome_$w.p$p.json --markdown \
      --set workload.count=16 "${extra[@]}" > $OUT/nooutcome_$w.p$p.md 2>&1
    echo "   rc=$? $(( $(date +%s) - start )) s $(uptime)" >> $OUT/nooutcome_runs.log
  done
done
echo done >> $OUT/nooutcome_runs.log
