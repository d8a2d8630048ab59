"""Built-in qaic backend: Qualcomm Cloud AI 100 via qaic-compile and qaicrt (DESIGN §4, §5).

Importing this package never imports the SDK: lint loads every plugin.
"""
from __future__ import annotations

from spdflow.hookspecs import hookimpl
from spdflow_qaic.backend import QaicBackend
from spdflow_qaic.config import QaicConfig

__all__ = ["QaicBackend", "QaicConfig"]


@hookimpl
def spdflow_register_backends(register):
    """Register the "qaic" backend."""
    register(
        "qaic",
        QaicBackend,
        config=QaicConfig,
        description="Qualcomm Cloud AI 100: qaic-compile builds qpc-<hash>/, qaicrt runs it "
        "(--compile-only works without the SDK).",
    )
