"""The ``roofline`` cost model: one verify run costs

    max((weight bytes + KV bytes read) ÷ bandwidth, FLOPs ÷ peak) + overhead

from a device profile (``profiles/<name>.yaml``: bandwidth, peak, overhead, precisions, and the
source of every number) and the model's shape (its config.json, or a shipped shape in
``models/``). Per run of ``tokens = batch × (K+1)`` positions (prefill: ``batch × seq_len``):

* weight bytes — every linear weight once (q, k, v, o, gate, up, down per layer, and the LM
  head, which scores every kept position) × bytes per weight of the weight precision;
* KV bytes — ``batch × layers × 2 × kv_heads × head_dim × ctx_len`` × bytes per element of the
  KV precision: static shapes attend over the whole cache, masked;
* FLOPs — ``2 × linear weights × tokens`` plus attention ``4 × layers × heads × head_dim ×
  ctx_len × tokens``.

Bytes per element: float32 4, float16/bfloat16 2; the OCP Microscaling (MX) v1.0 formats share one
8-bit scale per block of 32 elements, so mxfp6 is (32 × 6 + 8) ÷ 32 = 6.25 bits and mxint8
8.25 bits per element.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import CostContext, CostModel
from spdflow.errors import UsageError

HERE = Path(__file__).parent
PROFILES = HERE / "profiles"
MODELS = HERE / "models"

BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0,
         "mxfp6": (32 * 6 + 8) / 32 / 8, "mxint8": (32 * 8 + 8) / 32 / 8}


class RooflineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str = Field(description="A shipped device profile (see `profiles/`) or a path to a profile YAML.")
    model: str | None = Field(None, description="A shipped model shape (see `models/`), a path to a Hugging Face "
                                                "config.json, or none: the run's own model.")
    weights: str | None = Field(None, description="Weight precision (float32, float16, bfloat16, mxfp6, int8); "
                                                  "default: the profile's.")
    kv: str | None = Field(None, description="KV cache precision (float32, float16, mxint8, ...); default: the profile's.")
    overhead_ms: float | None = Field(None, ge=0, description="Fixed time per run; default: the profile's.")
    ctx_len: int | None = Field(None, ge=1, description="KV positions read per run; default: the run's ctx_len.")
    includes_host: bool | None = Field(None, description="The overhead covers the host's and the proposer's time per "
                                                         "step (fitted on end-to-end time per token); default: the profile's.")


@dataclass(frozen=True)
class ModelShape:
    """The sizes a roofline needs, from a Hugging Face config.json."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @staticmethod
    def from_config(config: dict, name: str) -> "ModelShape":
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            return ModelShape(name, hidden, int(config["num_hidden_layers"]), heads,
                              int(config.get("num_key_value_heads") or heads),
                              int(config.get("head_dim") or hidden // heads), int(config["intermediate_size"]),
                              int(config["vocab_size"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"model shape '{name}' lacks {exc} (needs hidden_size, num_hidden_layers, "
                             "num_attention_heads, intermediate_size, vocab_size)") from None

    def linear_weights(self) -> int:
        """Weights of every matmul a decode step runs: attention, MLP, and the LM head."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + 3 * self.hidden * self.intermediate
        return self.layers * per_layer + self.vocab * self.hidden


@dataclass(frozen=True)
class Profile:
    name: str
    bandwidth_gb_s: float
    peak_tflops: float
    overhead_ms: float
    weights: str
    kv: str
    description: str
    sources: dict
    includes_host: bool = False

    @staticmethod
    def load(name_or_path: str) -> "Profile":
        import yaml

        path = PROFILES / f"{name_or_path}.yaml"
        if not path.is_file():
            path = Path(name_or_path)
        if not path.is_file():
            shipped = ", ".join(sorted(p.stem for p in PROFILES.glob("*.yaml")))
            raise UsageError(f"device profile '{name_or_path}' does not exist", hint=f"shipped profiles: {shipped}")
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        try:
            return Profile(str(data.get("name", path.stem)), float(data["bandwidth_gb_s"]), float(data["peak_tflops"]),
                           float(data["overhead_ms"]), str(data["weights"]), str(data["kv"]),
                           str(data.get("description", "")), dict(data.get("sources", {})),
                           bool(data.get("includes_host", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"device profile '{path}' lacks or mistypes {exc}",
                             hint="keys: bandwidth_gb_s, peak_tflops, overhead_ms, weights, kv, sources") from None


def load_shape(model: str | None, ctx: CostContext | None) -> ModelShape:
    """A shipped shape by name, a config.json path, or the run's own model's config.json."""
    if model is None:
        if ctx is None:
            raise UsageError("the roofline needs --cost-with model=... when there is no run to read it from")
        path = Path(ctx.model_info.source_dir) / "config.json"
        name = ctx.model_info.name
    else:
        path = MODELS / f"{model}.json"
        name = model
        if not path.is_file():
            path = Path(model)
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in MODELS.glob("*.json")))
        raise UsageError(f"model shape '{model or path}' does not exist", hint=f"shipped shapes: {shipped}")
    return ModelShape.from_config(json.loads(path.read_text(encoding="utf-8")), name)


def precision_bytes(name: str) -> float:
    if name not in BYTES:
        raise UsageError(f"unknown precision '{name}'", hint=f"known: {', '.join(BYTES)}")
    return BYTES[name]


def run_cost(shape: ModelShape, tokens: int, batch: int, ctx_len: int, weight_bytes: float, kv_bytes: float,
             bandwidth: float, peak: float) -> tuple[float, float]:
    """(memory seconds, compute seconds) of one run of ``tokens`` positions over ``batch`` rows."""
    linear = shape.linear_weights()
    read = linear * weight_bytes + batch * shape.layers * 2 * shape.kv_heads * shape.head_dim * ctx_len * kv_bytes
    flops = 2.0 * linear * tokens + 4.0 * shape.layers * shape.heads * shape.head_dim * ctx_len * tokens
    return read / bandwidth, flops / peak


class RooflineCost(CostModel):
    name = "roofline"

    def __init__(self, config: RooflineConfig, ctx: CostContext | None = None):
        self.profile = Profile.load(config.profile)
        self.shape = load_shape(config.model, ctx)
        self.weights = config.weights or self.profile.weights
        self.kv = config.kv or self.profile.kv
        self.wbytes, self.kvbytes = precision_bytes(self.weights), precision_bytes(self.kv)
        self.overhead_s = (config.overhead_ms if config.overhead_ms is not None else self.profile.overhead_ms) / 1e3
        if config.ctx_len is not None:
            self.ctx_len = config.ctx_len
        elif ctx is not None:
            self.ctx_len = ctx.recipe.specialization.ctx_len
        else:
            raise UsageError("the roofline needs --cost-with ctx_len=N when there is no run to read it from")
        self.includes_host = self.profile.includes_host if config.includes_host is None else config.includes_host
        self.bandwidth = self.profile.bandwidth_gb_s * 1e9
        self.peak = self.profile.peak_tflops * 1e12

    def _time(self, batch: int, tokens: int) -> float:
        memory, compute = run_cost(self.shape, tokens, batch, self.ctx_len, self.wbytes, self.kvbytes,
                                   self.bandwidth, self.peak)
        return max(memory, compute) + self.overhead_s

    def verify_s(self, batch, k):
        return self._time(batch, batch * (k + 1))

    def prefill_s(self, batch, seq_len):
        return self._time(batch, batch * seq_len)

    def describe(self) -> dict[str, Any]:
        p = self.profile
        return {"cost_model": "roofline", "profile": p.name, "description": p.description,
                "bandwidth_gb_s": p.bandwidth_gb_s, "peak_tflops": p.peak_tflops,
                "overhead_ms": round(self.overhead_s * 1e3, 4), "includes_host": self.includes_host,
                "weights": self.weights, "kv": self.kv,
                "model": self.shape.name, "linear_weights": self.shape.linear_weights(), "ctx_len": self.ctx_len,
                "sources": p.sources}


def fit_overhead(shape: ModelShape, profile: Profile, batch: int, k: int, ctx_len: int, seconds: float,
                 weights: str | None = None, kv: str | None = None) -> float:
    """The overhead (ms) that makes the roofline give ``seconds`` for one run at (batch, K)."""
    memory, compute = run_cost(shape, batch * (k + 1), batch, ctx_len, precision_bytes(weights or profile.weights),
                               precision_bytes(kv or profile.kv), profile.bandwidth_gb_s * 1e9, profile.peak_tflops * 1e12)
    return (seconds - max(memory, compute)) * 1e3


def fit_profile(shape: ModelShape, points: dict[tuple[int, int], float], ctx_len: int, weights: str,
                kv: str) -> tuple[float, float, float, float]:
    """Bandwidth (GB/s), peak (TFLOP/s) and overhead (ms) that fit measured seconds per (batch, K)
    best in relative error (a log grid over bandwidth and peak, the overhead a median for each);
    returns them with the median |relative error|."""
    import numpy as np

    wb, kb = precision_bytes(weights), precision_bytes(kv)
    best = None
    for bw in np.geomspace(1, 1000, 121):
        for peak in np.geomspace(0.01, 100, 121):
            base = {p: max(run_cost(shape, p[0] * (p[1] + 1), p[0], ctx_len, wb, kb, bw * 1e9, peak * 1e12))
                    for p in points}
            overhead = max(0.0, float(np.median([points[p] - base[p] for p in points])))
            errors = [abs(base[p] + overhead - points[p]) / points[p] for p in points]
            score = float(np.median(errors))
            if best is None or score < best[3]:
                best = (float(bw), float(peak), overhead * 1e3, score)
    return best
