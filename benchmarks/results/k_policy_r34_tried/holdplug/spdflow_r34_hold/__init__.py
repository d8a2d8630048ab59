"""Issue 23, round 34: goodput variants registered as K policies of their own, so one `spdflow bench` runs them
beside goodput and the static modes: goodput_hold (steady_window 32) and goodput_b (goodput's defaults again,
under another name, to place a second copy elsewhere in the bench's rotating order)."""
from spdflow.hookspecs import hookimpl
from spdflow_decoding.goodput import Goodput, GoodputConfig


@hookimpl
def spdflow_register_k_policies(register):
    register("goodput_hold", lambda: Goodput(GoodputConfig(steady_window=32)),
             description="goodput with steady_window 32 (issue 23, round 34)")
    register("goodput_b", lambda: Goodput(GoodputConfig()),
             description="goodput's defaults under a second name (issue 23, round 34)")
