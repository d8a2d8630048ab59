"""Built-in what-if cost models (``spdflow whatif --cost NAME``), registered exactly as a
third-party plugin would register its own:

* ``measured`` — step costs timed on the run's own backend, stored with the run
  (``cost_grid.json``), measured on demand for batch sizes and K the run did not compile;
* ``table`` — a YAML of step costs per (batch, K) in milliseconds;
* ``roofline`` — max(bytes read ÷ bandwidth, FLOPs ÷ peak) + a fixed overhead, from a device
  profile (``profiles/*.yaml``) and the model's shape and precision.
"""
from __future__ import annotations

from spdflow.hookspecs import hookimpl

from .measured import MeasuredConfig, MeasuredCost
from .roofline import RooflineConfig, RooflineCost
from .table import TableConfig, TableCost

__all__ = ["MeasuredCost", "TableCost", "RooflineCost"]


@hookimpl
def spdflow_register_cost_models(register):
    register("measured", lambda config, ctx: MeasuredCost(config, ctx), config=MeasuredConfig,
             description="Step costs timed on the run's own backend, stored with the run (cost_grid.json).")
    register("table", lambda config, ctx: TableCost(config, ctx), config=TableConfig,
             description="A YAML of step costs per (batch, K) in milliseconds.")
    register("roofline", lambda config, ctx: RooflineCost(config, ctx), config=RooflineConfig,
             description="max(bytes ÷ bandwidth, FLOPs ÷ peak) + overhead, from a device profile and the model's shape.")
