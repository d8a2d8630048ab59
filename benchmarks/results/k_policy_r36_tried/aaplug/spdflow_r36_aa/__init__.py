"""Issue 23, round 36: an A/A for the tables. ``aa_k7`` is a K policy that answers the largest compiled K on every
step and asks the engine for nothing, as ``fixed:7`` does, but runs as a policy row of its own (``varK:aa_k7``) in
the same bench processes. Its tok/s over fixed K = 7's in the same repeat is what the tables measure between two
identical schedules: the instrument's own spread, and what a policy that costs nothing would be charged by it."""
from spdflow.api import KPolicy
from spdflow.hookspecs import hookimpl


class LargestK(KPolicy):
    """Always the largest compiled K, without declaring it (so the bench runs it as a varK row)."""

    name = "aa_k7"

    def choose_k(self, proposal_counts, compiled_ks):
        return max(compiled_ks)


@hookimpl
def spdflow_register_k_policies(register):
    register("aa_k7", LargestK, description="the largest compiled K every step, as a policy row (issue 23, round 36 A/A)")
