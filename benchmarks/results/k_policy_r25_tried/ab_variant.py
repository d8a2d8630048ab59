"""Round 25's live A/B harness: spdflow bench with a goodput variant registered beside goodput under NAME.

The variant is goodput.py as one of this folder's diffs changes it, in a scratch checkout whose goodput.py
GOODPUT_VARIANT names, run with the given GoodputConfig fields (JSON values). From the repository root:

    git worktree add /tmp/v HEAD && git -C /tmp/v apply "$PWD/benchmarks/results/k_policy_r25_tried/duel.diff"
    GOODPUT_VARIANT=/tmp/v/plugins/spdflow_decoding/goodput.py python benchmarks/results/k_policy_r25_tried/ab_variant.py \\
        goodput_duel duel_rows=2 -- bench recipes/tinycode_varK.yaml --batch-sizes 1,2 --modes nospec,fixed:all,goodput,goodput_duel ...

Round 25 ran goodput_duel (duel.diff, duel_rows=2), goodput_relearn (relearn.diff, relearn_after=32) and
goodput_nooutcome (nooutcome.diff, budget_no_outcome=true); run_ab.sh gives each A/B's loop. nooutcome.diff
landed (goodput's budget_no_outcome, on by default): to compare with the old rule, name goodput's own file and set
budget_no_outcome=false.
"""
import importlib.util
import json
import os
import sys

name, rest = sys.argv[1], sys.argv[2:]
split = rest.index("--")
fields = {k: json.loads(v) for k, v in (a.split("=", 1) for a in rest[:split])}
spec = importlib.util.spec_from_file_location(f"{name}_mod", os.environ["GOODPUT_VARIANT"])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)

import spdflow.plugins as plugins  # noqa: E402
from spdflow.hookspecs import hookimpl  # noqa: E402


class Plugin:
    @hookimpl
    def spdflow_register_k_policies(self, register):
        register(name, lambda: mod.Goodput(mod.GoodputConfig(**fields)), description=f"goodput variant {fields} (round 25 A/B)")


original = plugins.get_plugin_manager


def with_variant(*args, **kwargs):
    pm = original(*args, **kwargs)
    pm.add_plugin(Plugin(), f"{name}-ab", version="1.0")
    return pm


plugins.get_plugin_manager = with_variant  # the CLI imports it from spdflow.plugins at each call
import spdflow.cli as cli  # noqa: E402

sys.argv = ["spdflow", *rest[split + 1:]]
cli.main()
