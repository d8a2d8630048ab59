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
    session_mode: Literal["static", "dynamic"] = Field(
        "static",
        description="One static-shape session per specialization (faster, default) or one dynamic "
        "session for all (less memory).",
    )
