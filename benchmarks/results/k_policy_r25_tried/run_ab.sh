#!/bin/bash
# round 25 duel A/B: 2 processes round-robin over 4 workloads, batch 1 and 2, 6 repeats
cd "$(git rev-parse --show-toplevel)"   # needs GOODPUT_VARIANT (see the harness); writes to $OUT
OUT=${OUT:-ab_out}; mkdir -p "$OUT"
. .venv/bin/activate
for p in 1 2; do
  for w in syn09 syn06 syn03 code; do
    case $w in
      syn09) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.9}}');;
      syn06) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.6}}');;
      syn03) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.3}}');;
      code) extra=();;
    esac
    start=$(date +%s)
    echo "== $w.p$p $(date -u +%H:%M:%S) $(uptime)" >> $OUT/duel_runs.log
    nice -n -20 python benchmarks/results/k_policy_r25_tried/ab_duel.py bench recipes/tinycode_varK.yaml --batch-sizes 1,2 \
      --modes nospec,fixed:all,goodput,goodput_duel --repeats 6 --json $OUT/duel_$w.p$p.json --markdown \
      --set workload.count=16 "${extra[@]}" > $OUT/duel_$w.p$p.md 2>&1
    echo "   rc=$? $(( $(date +%s) - start )) s $(uptime)" >> $OUT/duel_runs.log
  done
done
echo done >> $OUT/duel_runs.log
