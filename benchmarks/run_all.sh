#!/usr/bin/env bash
# Reproduce every table of benchmarks/README.md (about 20 minutes on 2 cores).
# Run from the repository root; EMBEDDED_ONLY=1 skips the 50M tables. Results: benchmarks/results/<name>.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
mkdir -p "$OUT"
REPEATS=${REPEATS:-3}
bench() {  # bench NAME RECIPE ARGS...
  local name=$1 recipe=$2; shift 2
  echo "== $name" >&2
  python -m spdflow bench "$recipe" --repeats "$REPEATS" --json "$OUT/$name.json" --markdown "$@" > "$OUT/$name.md"
  cat "$OUT/$name.md"
}
ALL=1,2,4,8
ENDS=1,8  # secondary workloads: the two ends of the batch range
# embedded model (tinycode-target, 4M params), code workload
bench code_prompt_lookup recipes/tinycode_varK.yaml --batch-sizes $ALL --peers hf --repeats 5
bench code_suffix        recipes/tinycode_suffix.yaml --batch-sizes $ENDS
bench code_draft         recipes/tinycode_draft.yaml --batch-sizes $ENDS --peers hf
bench code_multiproj     recipes/tinycode_multiproj.yaml --batch-sizes $ENDS
bench code_eagle         recipes/tinycode_eagle.yaml --batch-sizes $ENDS
bench code_synthetic_0.6 recipes/tinycode_varK.yaml --batch-sizes $ENDS \
  --set 'proposer={uses: synthetic, with: {acceptance_rate: 0.6}}'
# proposals are rare: synthetic that never proposes; prompt lookup on the rare workload at T=1
bench rare_synthetic_p0  recipes/tinycode_varK.yaml --batch-sizes $ENDS \
  --set 'proposer={uses: synthetic, with: {proposal_rate: 0.0}}' --repeats 5
bench rare_prompt_lookup recipes/tinycode_rare.yaml --batch-sizes $ENDS --repeats 5
# ~52M random Llama (make it first), synthetic proposer at three acceptance rates
[ -n "${EMBEDDED_ONLY:-}" ] && exit 0  # EMBEDDED_ONLY=1: the tables above only
python benchmarks/make_50m_model.py >&2
for a in 0.3 0.6 0.9; do
  bench "50m_synthetic_$a" recipes/bench_50m_synthetic.yaml --batch-sizes 1,8 --allow-outside-paths \
    --set "proposer.with.acceptance_rate=$a"
done
