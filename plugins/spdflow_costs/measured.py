"""The ``measured`` cost model: step costs timed on the run's own backend (``cost_grid.json``)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import CostContext, CostModel
from spdflow.costs import AFTER_CHANGE, GRID_FILE, MIN_STEPS, GridEntry, in_situ, level_scale, read_grid
from spdflow.errors import RunDataError


class MeasuredConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    remeasure: bool = Field(False, description="Time every shape again, even those cost_grid.json already has.")
    in_situ: bool = Field(True, description="Price the run's own batch size with its own verify times (from its "
                          "trace: mean verify time of each K it ran at least 5 times; a K it ran less often, and the switch, at "
                          "the grid's time x the median ratio of the run's time to the grid's over the K both have), time "
                          "other shapes with the run's host gap between runs, and charge the run's own host time per step "
                          "instead of the replay's.")


class MeasuredCost(CostModel):
    """Medians timed by :func:`spdflow.costs.measure_grid` on the run's backend.

    The run stores its own batch size and K-list; other batch sizes and K are compiled and timed
    on first use (``prepare``), on the same backend, and stored with the run too.
    """

    name = "measured"

    def __init__(self, config: MeasuredConfig | None, ctx: CostContext):
        self.ctx = ctx
        self.remeasure = bool(config and config.remeasure)
        self.grid: dict[int, GridEntry] = read_grid(ctx.run_dir)
        self.fresh: set[int] = set()
        self.own = in_situ(ctx.records) if (config is None or config.in_situ) else None
        #: seconds of host work per step the replay charges instead of its own (None: its own)
        self.host_per_step_s = self.own.host_per_step_s if self.own else None
        self._scale: float | None = None  # scale() at the run's own batch size, once the grid has its K

    def prepare(self, needs: dict[int, list[int]]) -> None:
        """Measure every (batch, K) in ``needs`` that is not stored yet (all of them with remeasure)."""
        for batch, ks in sorted(needs.items()):
            entry = self.grid.get(batch)
            stale = self.remeasure and batch not in self.fresh
            if entry is not None and not stale and all(k in entry.verify_s for k in ks):
                continue
            if self.ctx.measure is None:
                raise RunDataError(f"{GRID_FILE} in '{self.ctx.run_dir}' has no step cost for batch {batch}, "
                                   f"K in {sorted(ks)}, and backend '{self.ctx.recipe.devices.backend}' cannot run here "
                                   "to measure it", hint="use --cost table or --cost roofline")
            want = set(ks) | (set(entry.verify_s) if entry is not None else set())
            self.grid[batch] = self.ctx.measure(batch, sorted(want), gap_s=self.own.gap_s if self.own else 0.0)
            self.fresh.add(batch)
            if self.own is not None and batch == self.own.batch:
                self._scale = None  # the grid it was taken from changed

    def _entry(self, batch: int, k: int) -> GridEntry:
        entry = self.grid.get(batch)
        if entry is None or k not in entry.verify_s:
            self.prepare({batch: [0, k]})
            entry = self.grid[batch]
        return entry

    def _often(self) -> dict[int, float]:
        """The run's own mean verify time of each K it ran at least MIN_STEPS times."""
        own = self.own
        return {k: v for k, v in own.verify_s.items() if own.steps[k] >= MIN_STEPS} if own is not None else {}

    def scale(self, batch: int) -> float:
        """What a grid time is multiplied by at this batch size: at the run's own, the level of its
        own steps against the grid's (:func:`spdflow.costs.level_scale`), else 1."""
        if self.own is None or batch != self.own.batch:
            return 1.0
        if self._scale is None:
            often = self._often()
            entry = self._entry(batch, min(often)) if often else None
            self._scale = level_scale(often, entry.verify_s) if entry is not None else 1.0
        return self._scale

    def verify_s(self, batch, k):
        own = self.own
        if own is not None and batch == own.batch and own.steps.get(k, 0) >= MIN_STEPS:
            return own.verify_s[k]
        return self._entry(batch, k).verify_s[k] * self.scale(batch)

    def cautions(self, batch):
        """A K priced from the run's own steps when most of them were among the first few after a
        change of K or a prefill (:data:`spdflow.costs.AFTER_CHANGE`): those run slower, so the
        mean carries the switch's time, which the replay charges again. A K that a goodput run held
        only in short spells at batch 1 was priced at 1.03 ms against the grid's 0.57 and K = 7's
        1.17 this way (issue 23, round 28)."""
        own = self.own
        if own is None or batch != own.batch:
            return []
        return [f"K={k} is priced at the run's own mean over {own.steps[k]} steps, {own.after_change.get(k, 0)} of "
                f"them within {AFTER_CHANGE} steps of a change of K or a prefill, which run slower: that price carries "
                f"the switch's time, charged again on top (--cost-with in_situ=false prices every K from the grid)"
                for k in sorted(self._often()) if 2 * own.after_change.get(k, 0) > own.steps[k]]

    def switch_s(self, batch):
        return self._entry(batch, 0).switch_s * self.scale(batch)

    def prefill_s(self, batch, seq_len):
        entry = self._entry(batch, 0)
        return entry.prefill_s if entry.prefill_seq_len == seq_len else None

    def describe(self):
        batches = {str(b): {"verify_ms": {str(k): round(v * 1e3, 4) for k, v in sorted(e.verify_s.items())},
                            "switch_ms": round(e.switch_s * 1e3, 4), "measured_at": e.measured_at, "load": e.load}
                   for b, e in sorted(self.grid.items())}
        own = None
        if self.own is not None:
            own = {"batch": self.own.batch, "host_per_step_ms": round(self.own.host_per_step_s * 1e3, 4),
                   "gap_ms": round(self.own.gap_s * 1e3, 4),
                   "verify_ms": {str(k): round(v * 1e3, 4) for k, v in sorted(self._often().items())}}
            if self.own.batch in self.grid:
                own["grid_scale"] = round(self.scale(self.own.batch), 4)
        return {"cost_model": "measured", "in_situ": own,
                "source": f"{GRID_FILE} in the run directory: medians of verify runs timed on backend "
                          f"'{self.ctx.recipe.devices.backend}' (blocks of one K; switch = extra time of the first run "
                          "after a change between the smallest and largest K timed)",
                "batches": batches}
