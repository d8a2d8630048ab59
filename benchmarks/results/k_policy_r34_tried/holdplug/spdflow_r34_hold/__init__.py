"""Issue 23, round 34: goodput with steady-K holds (steady_window 32) registered as its own K policy,
so one `spdflow bench` runs it beside goodput's default (steady_window 0) and the static modes."""
from spdflow.hookspecs import hookimpl
from spdflow_decoding.goodput import Goodput, GoodputConfig


@hookimpl
def spdflow_register_k_policies(register):
    register("goodput_hold", lambda: Goodput(GoodputConfig(steady_window=32)),
             description="goodput with steady_window 32 (issue 23, round 34)")
