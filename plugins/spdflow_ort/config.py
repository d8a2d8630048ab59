"""The ``with:`` block of ``devices: {backend: onnxruntime}``."""
from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from spdflow.ccl import CclSettings


class OrtConfig(CclSettings):
    """onnxruntime's settings: threads, execution provider and session mode."""

    model_config = ConfigDict(extra="forbid")

    # Bounded: ONNX Runtime tries to start every thread it is asked for (1,000,000 hung the run).
    threads: int | None = Field(None, ge=1, le=1024, description="Intra-op threads (default: all cores; at most 1024).")
    execution_provider: Literal["cpu", "cuda"] = Field(
        "cpu", description="CPU, or the CUDA execution provider when installed."
    )
    spinning: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Whether ORT's worker threads spin between the ops of a step: on (one process-wide pool, "
        "ORT's default), off (a sleeping pool per session), or auto (default): on for models under 64 MiB of "
        "weights (sub-millisecond ops, where waking a sleeping thread costs more than the op); above, on while "
        "fewer than half the cores are busy (1-minute load average when the run starts) and off otherwise "
        "(spinning threads fight every other process for the cores). The compile stage reports the choice.",
    )
    graph: Literal["reference", "fused"] = Field(
        "reference",
        description="The graph the target's decode steps run: reference (default), the exported graph, the one a "
        "QAIC host compiles; or fused, a CPU graph built from the same weights with ONNX Runtime's fused kernels "
        "(GroupQueryAttention with RoPE and the KV cache in place, SkipSimplifiedLayerNormalization). Prefill "
        "and a draft model always run the reference graph. fused needs a llama/qwen2/mistral float32 model on the CPU, a "
        "head_dim that is a multiple of 16, no continuous batching and no extra target outputs.",
    )
    session_mode: Literal["auto", "static", "dynamic"] = Field(
        "auto",
        description="One static-shape session per specialization (each holds its own packed copy of the "
        "weights), one dynamic session for all (one copy), or auto (default): static while the extra copies "
        "stay under 256 MiB (small models, where static is faster), else dynamic. The compile stage reports "
        "the choice.",
    )
