"""The ``with:`` block of ``devices: {backend: onnxruntime}``."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OrtConfig(BaseModel):
    """onnxruntime's settings: threads, execution provider and session mode."""

    model_config = ConfigDict(extra="forbid")

    threads: int | None = Field(None, ge=1, description="Intra-op threads (default: all cores).")
    execution_provider: Literal["cpu", "cuda"] = Field(
        "cpu", description="CPU, or the CUDA execution provider when installed."
    )
    session_mode: Literal["static", "dynamic"] = Field(
        "static",
        description="One static-shape session per specialization (faster, default) or one dynamic "
        "session for all (less memory).",
    )
