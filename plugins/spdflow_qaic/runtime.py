"""A spdflow Session over qaicrt, the Cloud AI SDK's low-level runtime.

Modelled on QEfficient's QAICInferenceSession (research/qefficient.md §3.1): load the program,
read the IO descriptor, and run by handing qaicrt one buffer per binding. The specialization is
chosen by the runtime from the buffer shapes, so the logits buffer is sized [B, K+1, V] per call;
past_* inputs and *_RetainedState outputs get zero-size buffers so the KV cache never leaves the
device. qaicrt is imported only here, and only when a session is opened.
"""
from __future__ import annotations

import importlib
import platform
import sys
from pathlib import Path
from types import ModuleType
from typing import Sequence

import numpy as np

from spdflow.api import Specialization
from spdflow.ccl import pick_ccl
from spdflow.errors import BackendUnavailableError, StageError

#: Where the SDK installs its Python modules when they are not on sys.path (as QEfficient).
SDK_PYTHON_DIRS = (f"/opt/qti-aic/dev/lib/{platform.machine()}", "/opt/qti-aic/dev/python")

UNAVAILABLE = (
    "the QAIC runtime (qaicrt and QAicApi_pb2 from the Cloud AI SDK) is not installed here; "
    "use --compile-only to build QPCs without a device, or devices.backend: onnxruntime to run"
)


def _import(name: str) -> ModuleType | None:
    """Import a SDK module, also from the SDK's install dirs; None when it is not there."""
    try:
        return importlib.import_module(name)
    except ImportError:
        pass
    for directory in SDK_PYTHON_DIRS:
        if Path(directory).is_dir() and directory not in sys.path:
            sys.path.append(directory)
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def load_runtime() -> tuple[ModuleType, ModuleType]:
    """(qaicrt, QAicApi_pb2), or BackendUnavailableError when the SDK is missing."""
    qaicrt, aicapi = _import("qaicrt"), _import("QAicApi_pb2")
    if qaicrt is None or aicapi is None:
        raise BackendUnavailableError(UNAVAILABLE)
    return qaicrt, aicapi


def runtime_unavailable_reason() -> str | None:
    """None when qaicrt imports, else one sentence saying what to do instead."""
    try:
        load_runtime()
    except BackendUnavailableError as exc:
        return exc.message
    return None


def _numpy_dtypes(aicapi: ModuleType) -> dict[int, np.dtype]:
    # QEfficient's map; bfloat16 buffers travel as float16-sized elements.
    pairs = [
        ("BFLOAT16_TYPE", np.float16), ("FLOAT_TYPE", np.float32), ("FLOAT_16_TYPE", np.float16),
        ("INT8_Q_TYPE", np.int8), ("UINT8_Q_TYPE", np.uint8), ("INT16_Q_TYPE", np.int16),
        ("INT32_Q_TYPE", np.int32), ("INT32_I_TYPE", np.int32), ("INT64_I_TYPE", np.int64),
        ("INT8_TYPE", np.int8),
    ]
    return {getattr(aicapi, name): np.dtype(dtype) for name, dtype in pairs if hasattr(aicapi, name)}


def _is_kv(name: str) -> bool:
    return name.startswith("past_") or name.endswith("_RetainedState")


class QaicSession:
    """spdflow.api.Session over a compiled qpc/ directory, KV cache resident on the device."""

    def __init__(
        self,
        qpc_path: Path,
        *,
        device_ids: Sequence[int] | None,
        specializations: Sequence[Specialization],
        vocab_size: int,
    ):
        self._rt, aicapi = load_runtime()
        self.specializations = list(specializations)
        first = self.specializations[0]
        self.kv_batch_size = first.full_batch_size or first.batch_size
        self.ctx_len = first.ctx_len
        self.vocab_size = vocab_size
        #: (batch, seq_len, nlk) -> compute context lengths ascending, for programs with CCLs
        self._ccls: dict[tuple[int, int, int], list[int]] = {}
        for spec in self.specializations:
            if spec.comp_ctx_lengths is not None:
                key = (spec.batch_size, spec.seq_len, spec.num_logits_to_keep)
                self._ccls[key] = sorted({*self._ccls.get(key, []), spec.comp_ctx_lengths})
        self._dtypes = _numpy_dtypes(aicapi)
        self._open(qpc_path, list(device_ids) if device_ids else None, aicapi)

    # -- loading

    def _check(self, status, what: str) -> None:
        if status != self._rt.QStatus.QS_SUCCESS:
            raise StageError(f"qaicrt failed to {what} ({status}); check the device with qaic-util -q")

    def _open(self, qpc_path: Path, device_ids: list[int] | None, aicapi: ModuleType) -> None:
        rt = self._rt
        if device_ids:
            self._context = rt.Context(rt.QIDList(device_ids))
            self._queue = rt.Queue(self._context, device_ids[0])
        else:
            self._context = rt.Context()
            self._queue = rt.Queue(self._context, 0)
        qpc = rt.Qpc(str(qpc_path))
        status, iodesc_bytes = qpc.getIoDescriptor()
        self._check(status, f"read the IO descriptor of {qpc_path}")
        iodesc = aicapi.IoDesc()
        iodesc.ParseFromString(bytes(iodesc_bytes))
        self._bindings = list(iodesc.selected_set.bindings)
        self._index = {binding.name: binding.index for binding in self._bindings}
        self._allowed_shapes = [
            [list(shape.dims) for shape in allowed.shapes] for allowed in iodesc.allowed_shapes
        ]
        self._output_names = [
            b.name for b in self._bindings if b.dir == aicapi.BUFFER_IO_TYPE_OUTPUT
        ]
        # [vocab], or [heads+1, vocab] for a multi-projection target's 4-D logits
        dims = list(self._bindings[self._index["logits"]].dims) if "logits" in self._index else []
        self._logits_tail = tuple(dims[2:]) if len(dims) == 4 else (self.vocab_size,)
        # One device: its id; a group: None, and the group goes into devMapping.
        device = device_ids[0] if device_ids and len(device_ids) == 1 else None
        self._program = rt.Program(self._context, device, qpc, self._properties(device_ids))
        self._check(self._program.load(), f"load {qpc_path}")
        self._program.activate()
        self._exec = rt.ExecObj(self._context, self._program)
        self._buffers = [rt.QBuffer(bytes(b.size)) for b in self._bindings]
        self._dims = rt.BufferDimensionsVecRef(
            [(self._dtypes[b.type].itemsize, list(b.dims)) for b in self._bindings]
        )
        # Zero-size KV buffers: the runtime keeps the retained state on the device.
        self._set({b.name: np.array([], dtype=np.float16) for b in self._bindings if _is_kv(b.name)})

    def _properties(self, device_ids: list[int] | None):
        properties = self._rt.QAicProgramProperties()
        properties.dataPathTimeoutMs = 60_000
        if device_ids and len(device_ids) > 1:
            properties.devMapping = ":".join(map(str, device_ids))
        return properties

    # -- running

    def _set(self, arrays: dict[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            index = self._index.get(name)
            if index is None:
                continue  # e.g. batch_index on a program compiled without continuous batching
            array = np.ascontiguousarray(array)
            self._buffers[index] = self._rt.QBuffer(array.tobytes())
            self._dims[index] = (array.itemsize, array.shape if array.ndim else (1,))

    def _output_dtype(self, name: str) -> np.dtype:
        return self._dtypes[self._bindings[self._index[name]].type]

    def run(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        num_logits_to_keep: int,
        batch_index: np.ndarray | None = None,
    ) -> np.ndarray:
        """One forward pass; the shapes of the buffers select the specialization (with CCLs, the
        length of ``comp_ctx_lengths``: the smallest that holds the step's last position)."""
        batch = input_ids.shape[0]
        arrays = {
            "input_ids": np.asarray(input_ids, dtype=np.int64),
            "position_ids": np.asarray(position_ids, dtype=np.int64),
            # Only its first dimension matters: it selects how many logits rows are kept.
            "num_logits_to_keep": np.zeros((num_logits_to_keep, 1), dtype=np.int64),
            "logits": np.zeros((batch, num_logits_to_keep, *self._logits_tail), self._output_dtype("logits")),
        }
        if batch_index is not None:
            arrays["batch_index"] = np.asarray(batch_index, dtype=np.int64)
        ccls = self._ccls.get((batch, input_ids.shape[1], num_logits_to_keep))
        if ccls:
            ccl = pick_ccl(arrays["position_ids"], ccls)
            arrays["comp_ctx_lengths"] = np.zeros(ccl, dtype=np.int64)
        self._set(arrays)
        rt = self._rt
        self._check(self._exec.setData(self._buffers, self._dims), "set the input buffers")
        self._check(self._queue.enqueue(self._exec), "enqueue the run")
        if self._exec.waitForCompletion() != rt.QStatus.QS_SUCCESS:
            raise StageError(self._no_shape_message(arrays))
        status, outputs = self._exec.getData()
        self._check(status, "read the outputs")
        index = self._index["logits"]
        logits = np.frombuffer(bytes(outputs[index]), self._output_dtype("logits"))
        return logits.reshape(batch, num_logits_to_keep, *self._logits_tail).astype(np.float32, copy=False)

    def _no_shape_message(self, arrays: dict[str, np.ndarray]) -> str:
        passed = ", ".join(f"{name} {list(a.shape)}" for name, a in arrays.items())
        return (
            f"qaicrt found no compiled specialization for {passed}; "
            f"compile a decode shape for this K (allowed shapes: {self._allowed_shapes})"
        )

    def close(self) -> None:
        """Release the program so the device cores can be reused."""
        program = getattr(self, "_program", None)
        if program is not None:
            self._exec = None
            program.deactivate()
            self._program = None
