"""Scratch A/B harness of round 25: spdflow bench with goodput_nooutcome registered beside goodput. goodput_nooutcome is
goodput.py as nooutcome.diff changes it, in a scratch checkout whose goodput.py GOODPUT_VARIANT names, e.g. from the
repository root:
    git worktree add /tmp/v HEAD && git -C /tmp/v apply "$PWD/benchmarks/results/k_policy_r25_tried/nooutcome.diff"
    GOODPUT_VARIANT=/tmp/v/plugins/spdflow_decoding/goodput.py python benchmarks/results/k_policy_r25_tried/ab_nooutcome.py bench recipes/tinycode_varK.yaml ...
The change landed (goodput's budget_no_outcome, on by default since round 25): against today's goodput the variant is the
same rule; to compare with the old one, register goodput with budget_no_outcome = False instead."""
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("goodput_nooutcome_mod", os.environ["GOODPUT_VARIANT"])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
from spdflow.hookspecs import hookimpl
import spdflow.plugins as plugins

class NoOutcomeConfig(mod.GoodputConfig):
    budget_no_outcome: bool = True

class Plugin:
    @hookimpl
    def spdflow_register_k_policies(self, register):
        register("goodput_nooutcome", lambda: mod.Goodput(NoOutcomeConfig()), description="goodput, budget without last outcomes (round 25 A/B)")

orig = plugins.get_plugin_manager
def patched(*a, **k):
    pm = orig(*a, **k)
    pm.add_plugin(Plugin(), "goodput-nooutcome-ab", version="1.0")
    return pm
plugins.get_plugin_manager = patched
import spdflow.cli as cli
for name in list(sys.modules):
    m = sys.modules[name]
    if name.startswith("spdflow") and getattr(m, "get_plugin_manager", None) is orig:
        m.get_plugin_manager = patched
sys.argv = ["spdflow", *sys.argv[1:]]
cli.main()
