"""Issue 23, round 35: goodput with both of round 34's parked changes on (the counting hold, steady_window 32, and
host_follows), registered as a K policy of its own so that one `spdflow bench` runs it beside goodput. The fields
exist only with `../hold_budget_host_follows_r35.diff` applied (`git apply`): both changes came off after rule R2."""
from spdflow.hookspecs import hookimpl
from spdflow_decoding.goodput import Goodput, GoodputConfig


@hookimpl
def spdflow_register_k_policies(register):
    register("goodput_r35", lambda: Goodput(GoodputConfig(steady_window=32, host_follows=True)),
             description="goodput with steady_window 32 and host_follows (issue 23, round 35)")
    # round 35, after R1: each of the two changes alone, to place the synthetic 0.9 b1 lock-in
    register("goodput_hold32", lambda: Goodput(GoodputConfig(steady_window=32)),
             description="goodput with steady_window 32 only (issue 23, round 35)")
    register("goodput_hf", lambda: Goodput(GoodputConfig(host_follows=True)),
             description="goodput with host_follows only (issue 23, round 35)")
