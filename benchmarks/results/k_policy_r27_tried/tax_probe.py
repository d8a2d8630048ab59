"""Round 27's rule R7: does a K policy's Python work between verify runs slow the verify runs?

benchmarks/policy_time.py with two K policies registered for the probe, both varK (every K of the list) and both
answering the largest K: ``probe_idle`` does nothing else, ``probe_burn`` also builds and drops about ``BURN`` small
Python objects in each choose_k (90 by default); ``probe_spin`` spends about the
same time in a loop of small-int arithmetic (``SPIN`` turns, 400 by default) that keeps nothing (both about 20 us driven alone). Run pinned, so every mode verifies the same K; from the repository root:
    python benchmarks/results/k_policy_r27_tried/tax_probe.py recipes/tinycode_varK.yaml --batch 1 --repeats 8 \\
        --pin 7 --modes fixed:7,probe_idle,probe_burn,probe_spin,goodput --set workload.count=16 --set workload.builtin=stdlib_tests"""
import os
import sys

sys.path.insert(0, "benchmarks")
import policy_time  # noqa: E402
from spdflow.api import KPolicy  # noqa: E402
from spdflow.hookspecs import hookimpl  # noqa: E402

BURN = int(os.environ.get("BURN", "90"))
SPIN = int(os.environ.get("SPIN", "400"))


class Idle(KPolicy):
    name = "probe_idle"

    def choose_k(self, proposal_counts, compiled_ks):
        return max(compiled_ks)


class Burn(Idle):
    name = "probe_burn"

    def choose_k(self, proposal_counts, compiled_ks):
        junk = [{"k": i, "v": [i, i + 1.0], "t": (i, str(i))} for i in range(BURN)]
        del junk
        return max(compiled_ks)


class Spin(Idle):
    name = "probe_spin"

    def choose_k(self, proposal_counts, compiled_ks):
        total = 0
        for i in range(SPIN):  # arithmetic on small ints: no object outlives a step of the loop
            total += i * i
        return max(compiled_ks)


class Plugin:
    @hookimpl
    def spdflow_register_k_policies(self, register):
        register("probe_idle", Idle, description="round 27 probe: answers the largest K")
        register("probe_burn", Burn, description="round 27 probe: the largest K after some Python work")
        register("probe_spin", Spin, description="round 27 probe: the largest K after a loop of arithmetic")


sys.exit(policy_time.main_with(Plugin(), "round27-probe", sys.argv[1:]))
