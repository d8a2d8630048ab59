"""Is a K = 0 step dearer under a K policy than under no-spec? probe_zero: varK, never proposes, always K = 0."""
import sys
sys.path.insert(0, "benchmarks")
import policy_time
from spdflow.api import KPolicy
from spdflow.hookspecs import hookimpl

class Zero(KPolicy):
    name = "probe_zero"
    def propose_budget(self, k_max, step):
        return 0
    def choose_k(self, proposal_counts, compiled_ks):
        return min(compiled_ks)

class Plugin:
    @hookimpl
    def spdflow_register_k_policies(self, register):
        register(Zero.name, Zero, description="probe: never proposes, always K = 0")

if __name__ == "__main__":
    sys.exit(policy_time.main_with(Plugin(), "zero-probe", sys.argv[1:]))
