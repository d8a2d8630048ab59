#!/bin/bash
# Round 25's live A/Bs: 2 processes round-robin over WORKLOADS, modes nospec,fixed:all,goodput,NAME, 16 prompts.
#   GOODPUT_VARIANT=... OUT=dir benchmarks/results/k_policy_r25_tried/run_ab.sh PREFIX NAME "FIELD=VALUE ..." BATCHES REPEATS WORKLOADS...
# (one or more GoodputConfig fields, space-separated, for the variant)
# as run (see rules.md):
#   run_ab.sh duel goodput_duel duel_rows=2 1,2 6 syn09 syn06 syn03 code
#   run_ab.sh relearn goodput_relearn relearn_after=32 4,8 4 code stdlib thirdparty
#   run_ab.sh nooutcome goodput_nooutcome budget_no_outcome=true 4,8 4 code stdlib thirdparty
#   run_ab.sh guard goodput_nooutcome budget_no_outcome=true 4,8 3 syn09 syn06 syn03 rare
#   run_ab.sh spell goodput_spell "settle=3 spell_share=true" 1,2 5 stdlib code thirdparty syn06   (round 28)
cd "$(git rev-parse --show-toplevel)"
. .venv/bin/activate
prefix=$1 name=$2 batches=$4 repeats=$5; read -r -a fields <<< "$3"; shift 5
OUT=${OUT:-ab_out}; mkdir -p "$OUT"
for p in 1 2; do
  for w in "$@"; do
    recipe=recipes/tinycode_varK.yaml
    case $w in
      syn09) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.9}}');;
      syn06) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.6}}');;
      syn03) extra=(--set 'proposer={uses: synthetic, with: {acceptance_rate: 0.3}}');;
      code) extra=();;
      stdlib) extra=(--set workload.builtin=stdlib_tests);;
      thirdparty) extra=(--set workload.builtin=thirdparty);;
      rare) recipe=recipes/tinycode_rare.yaml; extra=(--set workload.temperature=0);;
    esac
    start=$(date +%s)
    echo "== $w.p$p $(date -u +%H:%M:%S) $(uptime)" >> "$OUT/${prefix}_runs.log"
    nice -n -20 python benchmarks/results/k_policy_r25_tried/ab_variant.py "$name" "${fields[@]}" -- bench $recipe \
      --batch-sizes "$batches" --modes "nospec,fixed:all,goodput,$name" --repeats "$repeats" \
      --json "$OUT/${prefix}_$w.p$p.json" --markdown --set workload.count=16 "${extra[@]}" > "$OUT/${prefix}_$w.p$p.md" 2>&1
    echo "   rc=$? $(( $(date +%s) - start )) s $(uptime)" >> "$OUT/${prefix}_runs.log"
  done
done
echo done >> "$OUT/${prefix}_runs.log"
