"""Issue 23, round 36: goodput with round 36's two fields on, registered as a K policy of its own so that one
`spdflow bench` runs it beside goodput: ``learn_after`` 16 (a K is priced from the grid, at the running K's level and
host time, until it has run 16 steady steps) and ``own_share`` 0.01 (counts spaced so that the policy's counting and
pricing stay under 1 % of a step). The fields exist only with `../learn_after_own_share_r36.diff` applied (`git apply`):
both came off after rule R1 failed."""
from spdflow.hookspecs import hookimpl
from spdflow_decoding.goodput import Goodput, GoodputConfig


@hookimpl
def spdflow_register_k_policies(register):
    register("goodput_r36", lambda: Goodput(GoodputConfig(learn_after=16, own_share=0.01)),
             description="goodput with learn_after 16 and own_share 0.01 (issue 23, round 36)")
