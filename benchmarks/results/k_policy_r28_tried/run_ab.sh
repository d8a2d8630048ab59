#!/bin/bash
# Round 28's live A/B: round 25's run_ab.sh with any number of GoodputConfig fields for the variant.
#   GOODPUT_VARIANT=plugins/spdflow_decoding/goodput.py OUT=dir benchmarks/results/k_policy_r28_tried/run_ab.sh \
#       PREFIX NAME BATCHES REPEATS "FIELD=VALUE ..." WORKLOADS...
# as run (see rules.md): run_ab.sh spell goodput_spell 1,2 5 "settle=3 spell_share=true" stdlib code thirdparty syn06
cd "$(git rev-parse --show-toplevel)"
. .venv/bin/activate
prefix=$1 name=$2 batches=$3 repeats=$4; read -r -a fields <<< "$5"; shift 5
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
