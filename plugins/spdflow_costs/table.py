"""The ``table`` cost model: step costs per (batch, K) from a YAML file, in milliseconds.

    source: where the numbers come from (printed with every prediction)
    verify_ms:          # batch -> K -> one verify run, the step before at the same K
      1: {0: 0.67, 2: 0.99, 4: 1.13, 7: 1.44}
      8: {0: 2.2, 7: 5.6}
    switch_ms: {1: 0.38}    # optional: extra time of the first step after a change of K
    prefill_ms: {1: 11.5}   # optional: one prefill chunk (the run's prefill_seq_len)

K between two listed values is interpolated linearly; a batch size or K outside the table is an
error (one sentence naming the file).
"""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import CostContext, CostModel
from spdflow.errors import RunDataError, UsageError


class TableConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="The YAML file of step costs (relative paths: the current directory).")


def _numbers(mapping, what: str, path: Path) -> dict[int, float]:
    try:
        return {int(k): float(v) for k, v in (mapping or {}).items()}
    except (TypeError, ValueError, AttributeError):
        raise UsageError(f"'{path}': {what} must map integers to milliseconds") from None


class TableCost(CostModel):
    name = "table"

    def __init__(self, config: TableConfig, ctx: CostContext | None = None):
        import yaml

        self.path = Path(config.path)
        try:
            data = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"cost table '{self.path}' does not exist", hint="--cost-with path=FILE.yaml") from None
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cost table '{self.path}' is unreadable: {exc}".splitlines()[0]) from exc
        if not isinstance(data, dict) or not isinstance(data.get("verify_ms"), dict):
            raise UsageError(f"cost table '{self.path}' has no verify_ms mapping (batch -> K -> ms)")
        unknown = set(data) - {"source", "verify_ms", "switch_ms", "prefill_ms"}
        if unknown:
            raise UsageError(f"cost table '{self.path}' has unknown key '{sorted(unknown)[0]}'",
                             hint="keys: source, verify_ms, switch_ms, prefill_ms")
        self.source = str(data.get("source", ""))
        try:
            batches = {int(b): v for b, v in data["verify_ms"].items()}
        except (TypeError, ValueError):
            raise UsageError(f"'{self.path}': verify_ms must be keyed by batch size") from None
        self.verify = {b: _numbers(v, f"verify_ms[{b}]", self.path) for b, v in batches.items()}
        self.switch = _numbers(data.get("switch_ms"), "switch_ms", self.path)
        self.prefill = _numbers(data.get("prefill_ms"), "prefill_ms", self.path)

    def verify_s(self, batch, k):
        row = self.verify.get(batch)
        if not row:
            raise RunDataError(f"cost table '{self.path}' has no verify_ms for batch {batch}",
                               hint=f"batch sizes in it: {sorted(self.verify)}")
        if k in row:
            return row[k] / 1e3
        below = [x for x in row if x < k]
        above = [x for x in row if x > k]
        if not below or not above:
            raise RunDataError(f"cost table '{self.path}' cannot price K={k} at batch {batch} (it lists K {sorted(row)})",
                               hint="add that K, or ask for K values inside the table")
        lo, hi = max(below), min(above)
        return (row[lo] + (row[hi] - row[lo]) * (k - lo) / (hi - lo)) / 1e3

    def switch_s(self, batch):
        return self.switch.get(batch, 0.0) / 1e3

    def prefill_s(self, batch, seq_len):
        return self.prefill[batch] / 1e3 if batch in self.prefill else None

    def describe(self):
        return {"cost_model": "table", "path": str(self.path), "source": self.source or "not stated in the table"}
