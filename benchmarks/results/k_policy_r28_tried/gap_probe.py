"""Round 28's rule R1: does a longer host gap between verify runs slow the next verify run?

benchmarks/policy_time.py with K policies registered for the probe, each varK (every K of the list) and answering the
largest K after busy-waiting a fixed time in choose_k: ``probe_wait_0``, ``_25``, ``_50``, ``_100`` and ``_200`` (us), and ``probe_wait_0b``, a second ``probe_wait_0`` (an A/A pair).
The wait reads the clock in a loop and keeps nothing. Run pinned, so every mode verifies the same K; from the
repository root:
    python benchmarks/results/k_policy_r28_tried/gap_probe.py recipes/tinycode_varK.yaml --batch 1 --repeats 12 \\
        --pin 7 --modes fixed:7,probe_wait_0,probe_wait_25,probe_wait_50,probe_wait_100,probe_wait_200 \\
        --set workload.count=16 --set workload.builtin=stdlib_tests"""
import sys
import time

sys.path.insert(0, "benchmarks")
import policy_time  # noqa: E402
from spdflow.api import KPolicy  # noqa: E402
from spdflow.hookspecs import hookimpl  # noqa: E402

WAITS_US = (0, 25, 50, 100, 200)


def waiting(wait_us: int) -> type:
    class Wait(KPolicy):
        name = f"probe_wait_{wait_us}"

        def choose_k(self, proposal_counts, compiled_ks):
            end = time.perf_counter() + wait_us * 1e-6
            while time.perf_counter() < end:
                pass
            return max(compiled_ks)

    return Wait


class Plugin:
    @hookimpl
    def spdflow_register_k_policies(self, register):
        for wait_us in WAITS_US:
            register(f"probe_wait_{wait_us}", waiting(wait_us),
                     description=f"round 28 probe: the largest K after {wait_us} us of waiting")
        register("probe_wait_0b", waiting(0), description="round 28 probe: probe_wait_0 again (an A/A pair)")


sys.exit(policy_time.main_with(Plugin(), "round28-probe", sys.argv[1:]))
