"""Built-in backend plugin: ONNX Runtime, the CPU reference backend (DESIGN §5).

onnxruntime is imported only when a backend method runs, never at plugin import: lint loads
every plugin.
"""
from __future__ import annotations

from spdflow.hookspecs import hookimpl
from spdflow_ort.config import OrtConfig


def _make_backend():
    from spdflow_ort.backend import OrtBackend

    return OrtBackend()


@hookimpl
def spdflow_register_backends(register):
    """Register the "onnxruntime" backend."""
    register(
        "onnxruntime",
        _make_backend,
        config=OrtConfig,
        description="ONNX Runtime reference backend: one static-shape session per "
        "specialization, KV cache updated in place (CPU; CUDA EP when installed)",
    )
