#!/bin/bash
# round 25 guard G5: the other cells budget_no_outcome reaches (batch 4 and 8 of synthetic 0.9/0.6/0.3 and rare)
cd "$(git rev-parse --show-toplevel)"   # needs GOODPUT_VARIANT (see ab_nooutcome.py); writes to $OUT
. .venv/bin/activate
OUT=${OUT:-ab_out}; mkdir -p "$OUT"
for p in 1 2; do
  for w in syn09 syn06 syn03 rare; do
    case $w in
      syn09) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.9}}');;
      syn06) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.6}}');;
      syn03) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.3}}');;
      rare) extra=(--set workload.temperature=0);;
    esac
    recipe=recipes/tinycode_varK.yaml; [ $w = rare ] && recipe=recipes/tinycode_rare.yaml
    start=$(date +%s)
    echo "== $w.p$p $(date -u +%H:%M:%S) $(uptime)" >> $OUT/guard_runs.log
    nice -n -20 python benchmarks/results/k_policy_r25_tried/ab_nooutcome.py bench $recipe --batch-sizes 4,8 \
      --modes nospec,fixed:all,goodput,goodput_nooutcome --repeats 3 --json $OUT/guard_$w.p$p.json --markdown \
      --set workload.count=16 "${extra[@]}" > $OUT/guard_$w.p$p.md 2>&1
    echo "   rc=$? $(( $(date +%s) - start )) s $(uptime)" >> $OUT/guard_runs.log
  done
done
echo done >> $OUT/guard_runs.log
