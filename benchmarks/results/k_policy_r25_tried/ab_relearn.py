"""Scratch A/B harness of round 25: spdflow bench with goodput_relearn registered beside goodput. goodput_relearn is
goodput.py as relearn.diff changes it, in a scratch checkout whose goodput.py GOODPUT_VARIANT names, e.g. from the
repository root:
    git worktree add /tmp/v HEAD && git -C /tmp/v apply "$PWD/benchmarks/results/k_policy_r25_tried/relearn.diff"
    GOODPUT_VARIANT=/tmp/v/plugins/spdflow_decoding/goodput.py python benchmarks/results/k_policy_r25_tried/ab_relearn.py bench recipes/tinycode_varK.yaml ..."""
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("goodput_relearn_mod", os.environ["GOODPUT_VARIANT"])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
from spdflow.hookspecs import hookimpl
import spdflow.plugins as plugins

class RelearnConfig(mod.GoodputConfig):
    relearn_after: int = 32

class Plugin:
    @hookimpl
    def spdflow_register_k_policies(self, register):
        register("goodput_relearn", lambda: mod.Goodput(RelearnConfig()), description="goodput, relearn_after 32 (round 25 A/B)")

orig = plugins.get_plugin_manager
def patched(*a, **k):
    pm = orig(*a, **k)
    pm.add_plugin(Plugin(), "goodput-relearn-ab", version="1.0")
    return pm
plugins.get_plugin_manager = patched
import spdflow.cli as cli
for name in list(sys.modules):
    m = sys.modules[name]
    if name.startswith("spdflow") and getattr(m, "get_plugin_manager", None) is orig:
        m.get_plugin_manager = patched
sys.argv = ["spdflow", *sys.argv[1:]]
cli.main()
