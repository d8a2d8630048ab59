#!/usr/bin/env bash
# Plugin checks through real entry points, in the active Python environment (called by .ci/run):
#   1. install plugins/spdflow-rest and the deliberately broken tests/fixtures/broken_plugin;
#   2. `spdflow plugins` lists spdflow-rest's `rest` proposer and the broken plugins with their
#      errors (an import error, a sys.exit(0) at import, a misspelled hook name);
#   3. `spdflow run` of a recipe that does not use the broken plugins still succeeds, and one that
#      uses a name of the misspelled plugin fails with exit 4;
#   4. spdflow-rest's own tests (unit + the conformance suite) pass.
# Exits non-zero on the first failure. The broken fixture is uninstalled on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
PY="${PYTHON:-python}"
WORK="$(mktemp -d)"
cleanup() {
    "$PY" -m pip uninstall -q -y spdflow-broken-fixture >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*" >&2; }

step "install spdflow-rest and the broken fixture plugin"
"$PY" -m pip install -q "$REPO/plugins/spdflow-rest" "$REPO/tests/fixtures/broken_plugin"

step "spdflow plugins lists rest and reports the broken plugin"
"$PY" -m spdflow plugins > "$WORK/plugins.json"
"$PY" - "$WORK/plugins.json" <<'PYEOF'
import json, sys
plugins = {p["name"]: p for p in json.load(open(sys.argv[1]))}
rest = plugins.get("rest")
assert rest is not None, f"no 'rest' plugin in `spdflow plugins`: {sorted(plugins)}"
assert rest["distribution"] == "spdflow-rest", rest
assert rest["error"] is None, rest["error"]
assert "rest" in rest["registered"].get("proposer", []), rest["registered"]
broken = plugins.get("broken_fixture")
assert broken is not None, f"the broken fixture is not listed: {sorted(plugins)}"
assert broken["error"] and "broken on purpose" in broken["error"], broken
exiting = plugins.get("exiting_fixture")
assert exiting is not None and exiting["error"] == "SystemExit: 0", exiting
typo = plugins.get("typo_fixture")
assert typo is not None and "did you mean 'spdflow_register_proposers'" in (typo["error"] or ""), typo
for p in (broken, exiting, typo):
    print("ok:", p["name"], "error:", p["error"], file=sys.stderr)
print("ok: rest registers", rest["registered"], file=sys.stderr)
PYEOF
"$PY" -m spdflow schema | grep -q '"proposer_rest_config"' || { echo "rest's config is not in spdflow schema" >&2; exit 1; }

step "a recipe that does not use the broken plugin still runs"
(cd "$WORK" && "$PY" -m spdflow run "$REPO/recipes/tinycode_varK.yaml" -q \
    --set 'workload={prompts: ["def f(x):"], max_new_tokens: 8}' --check-lossless)

step "a recipe that uses the misspelled plugin's name fails with exit 4"
set +e
(cd "$WORK" && "$PY" -m spdflow run "$REPO/recipes/tinycode_varK.yaml" -q --set proposer.uses=typo_proposer \
    --set 'workload={prompts: ["def f(x):"], max_new_tokens: 8}' 2> "$WORK/typo.err")
code=$?
set -e
[ "$code" = 4 ] || { echo "expected exit 4, got $code" >&2; cat "$WORK/typo.err" >&2; exit 1; }
grep -q "typo_fixture" "$WORK/typo.err" || { cat "$WORK/typo.err" >&2; exit 1; }

step "spdflow-rest's tests (conformance suite included)"
"$PY" -m pytest -q -p no:cacheprovider "$REPO/plugins/spdflow-rest/tests"
step "plugin checks passed"
