"""OrtSession: the onnxruntime implementation of :class:`spdflow.api.Session`.

The KV cache lives in numpy arrays wrapped once in OrtValues and bound as BOTH the ``past_*``
input and the ``*_RetainedState`` output of every specialization (feasibility §4): ORT's
scatter kernels skip the input->output copy when the buffers are the same, so the cache is
updated in place. Logits land in a preallocated buffer per specialization. No torch here.

Modes: ``static`` (one InferenceSession per specialization, each graph with fixed dims; faster)
and ``dynamic`` (one InferenceSession on the dynamic graph; about one weights copy less per
specialization). Either way a run must match a compiled specialization, as on QAIC.

With compute context lengths (``comp_ctx_lengths`` shapes) each (batch, seq_len, nlk) exists
once per CCL; ``run`` takes the smallest CCL that holds the step's last position
(:func:`spdflow.ccl.pick_ccl`) and feeds ``comp_ctx_lengths`` of that length. In dynamic mode
the one session serves every CCL.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from spdflow.api import Specialization
from spdflow.ccl import pick_ccl
from spdflow.errors import BackendUnavailableError, StageError

MODES = ("static", "dynamic")
_NP_DTYPES = {"float32": np.float32, "float16": np.float16}
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@dataclass
class _Shape:
    """One runnable specialization: its session, IO binding and logits buffer."""

    spec: Specialization
    session: Any
    binding: Any
    logits: np.ndarray
    nlk_input: np.ndarray
    extra: dict[str, np.ndarray]  # other non-KV outputs (e.g. hidden_states), reused buffers
    ccl_input: np.ndarray | None = None  # comp_ctx_lengths [CCL] of CCL shapes
    fused: bool = False  # runs the fused decode graph (spdflow_ort.fused)


class OrtEnvironment:
    """ONNX Runtime's process-wide state as one object: its shared intra-op thread pool.

    Static specializations (and draft + target) alternate every decode step. With a pool per
    session each switch wakes another set of threads; one pool for the whole process made a
    step 1.2-1.8x faster on the 2-core bench machine (benchmarks/README.md, "Thread pools").
    ORT sizes that pool once per process, and once it exists every session must use it: the
    first session decides the thread count. A later session asking for another count runs on
    the pool that exists; this object knows that, so a session reports the threads it really
    has (:meth:`describe`, in the run report's generate stage), not only what its recipe asked.
    There is one per process (:data:`ENVIRONMENT`), handed to each session explicitly.
    """

    def __init__(self):
        #: threads of the shared pool once made (0: ORT's default, every core); None: not made
        self.pool_threads: int | None = None

    @property
    def pool_made(self) -> bool:
        """The shared pool exists: every later session of this process runs on it (and spins)."""
        return self.pool_threads is not None

    def shared_pool(self, threads: int | None) -> bool:
        """Make (once) and use the shared pool; False where ORT has none (per-session pools)."""
        import onnxruntime as ort

        if not hasattr(ort, "set_global_thread_pool_sizes"):
            return False
        if not self.pool_made:
            ort.set_global_thread_pool_sizes(int(threads or 0), 1)
            self.pool_threads = int(threads or 0)
        return True

    def describe(self, requested: int | None, shared: bool) -> dict:
        """The thread pool a session asking for ``requested`` threads really runs on."""
        pool = self.pool_threads if shared and self.pool_made else int(requested or 0)
        facts = {"thread_pool": "shared" if shared else "per_session", "threads_requested": requested,
                 "threads_effective": pool or os.cpu_count()}
        if shared and requested and pool and requested != pool:
            facts["note"] = (f"this process's shared ORT thread pool was made with {pool} threads by an earlier "
                             f"session; {requested} were asked for")
        return facts


#: the one per process: ORT's thread pool is process-wide
ENVIRONMENT = OrtEnvironment()

#: why a session asking for a sleeping pool spins all the same (compile line, run report)
POOL_ALREADY_SPINS = ("an earlier session of this process made ORT's process-wide pool, whose threads spin, "
                      "and ORT then allows no other")


def shared_pool(threads: int | None) -> bool:
    """:meth:`OrtEnvironment.shared_pool` of this process's :data:`ENVIRONMENT`."""
    return ENVIRONMENT.shared_pool(threads)


def session_options(threads: int | None, *, shared: bool = True):
    """SessionOptions for decode loops: one shared thread pool, or a non-spinning pool per session."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Once the process-wide pool exists ORT refuses per-session pools: such a session shares it.
    if (shared and shared_pool(threads)) or ENVIRONMENT.pool_made:
        options.use_per_session_threads = False
        return options
    # Several sessions (specializations, draft + target) alternate; spinning pools fight over
    # the cores and cost up to 2x (feasibility §4, pitfall 1).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.intra_op_num_threads = int(threads or 0)
    options.inter_op_num_threads = 1
    return options


def providers_for(execution_provider: str) -> list[str]:
    """The ORT provider list for "cpu" or "cuda"; BackendUnavailableError when not installed."""
    import onnxruntime as ort

    if execution_provider not in _PROVIDERS:
        raise StageError(
            f"onnxruntime: unknown execution provider '{execution_provider}'; use 'cpu' or 'cuda'"
        )
    wanted = _PROVIDERS[execution_provider]
    if wanted not in ort.get_available_providers():
        raise BackendUnavailableError(
            f"onnxruntime {ort.__version__} here has no {wanted}; install onnxruntime-gpu "
            "or set devices.with.execution_provider: cpu"
        )
    return [wanted] if wanted == "CPUExecutionProvider" else [wanted, "CPUExecutionProvider"]


class OrtSession:
    """A compiled program loaded in ONNX Runtime with its KV cache resident in host memory.

    :param program_dir: the ``qpc/`` directory of a compiled program (holds manifest.json).
    :param specializations: the shapes the program was compiled for.
    :param vocab_size: logits width.
    :param mode: "static" or "dynamic" (see the module docstring).
    :param execution_provider: "cpu" or "cuda".
    :param threads: intra-op threads per session (None: all cores).
    :param in_place: bind the KV cache in place (default); False uses plain ``run()`` and feeds
        the retained state back, kept for benchmarks and as a reference in tests.
    :param shared_threads: use the process-wide thread pool, whose threads spin between ops
        (default, see :func:`shared_pool`); False gives this session its own pool whose threads
        sleep when idle (``devices.with.spinning: off``).
    """

    def __init__(
        self,
        program_dir: Path | str,
        *,
        specializations: Sequence[Specialization],
        vocab_size: int,
        mode: str = "static",
        execution_provider: str = "cpu",
        threads: int | None = None,
        in_place: bool = True,
        shared_threads: bool = True,
    ):
        import onnxruntime as ort

        if mode not in MODES:
            raise StageError(f"onnxruntime: unknown session mode '{mode}'; use 'static' or 'dynamic'")
        self.program_dir = Path(program_dir)
        self.manifest = json.loads((self.program_dir / "manifest.json").read_text(encoding="utf-8"))
        self.mode = mode
        self.in_place = in_place
        self.specializations = list(specializations)
        self.vocab_size = int(vocab_size)
        self.ctx_len = self.specializations[0].ctx_len
        self.continuous_batching = bool(self.manifest.get("continuous_batching"))
        self.kv_batch_size = max(s.full_batch_size or s.batch_size for s in self.specializations)
        self.device = "cuda" if execution_provider == "cuda" else "cpu"
        providers = providers_for(execution_provider)
        options = session_options(threads, shared=shared_threads)
        self.threads_requested = threads
        self.shared_threads = not options.use_per_session_threads
        self.spinning_requested = shared_threads
        self.execution_provider = execution_provider

        #: the fused decode graph (manifest "fused"), used with the cache bound in place on the CPU
        fused = self.manifest.get("fused")
        self.kv_slots = int(fused["kv_slots"]) if fused else self.ctx_len
        self.graph = "fused" if fused and in_place and self.device == "cpu" else "reference"
        self._row_values: dict[tuple[str, int], Any] = {}
        self.input_names = list(self.manifest["inputs"])
        self.kv_inputs = [n for n in self.input_names if n.startswith("past_")]
        kv_dtype = self.manifest.get("kv_dtype", "float32")
        if kv_dtype not in _NP_DTYPES:
            raise StageError(
                f"onnxruntime: a {kv_dtype} KV cache is not supported by this backend; "
                "export the model as float32 or float16"
            )
        self._build_kv(_NP_DTYPES[kv_dtype])

        def open_graph(file: str):
            return ort.InferenceSession(str(self.program_dir / file), options, providers=providers)

        dynamic = open_graph(self.manifest["dynamic"]["file"]) if mode == "dynamic" else None
        entries = {tuple(sorted(g["symbols"].items())): g for g in self.manifest["graphs"]}
        self._shapes: dict[tuple[int, int, int, int | None], _Shape] = {}
        #: (batch, seq_len, nlk) -> its compute context lengths ascending ([None] without CCL)
        self._ccls: dict[tuple[int, int, int], list] = {}
        fused_shapes: dict[tuple[int, int, int], _Shape] = {}  # one per shape, whatever its CCL
        fused_dynamic: dict[int, Any] = {}
        # Prefill first: a decode shape equal to a prefill shape runs the reference graph.
        for spec in sorted(self.specializations, key=lambda s: s.kind != "prefill"):
            key = (spec.batch_size, spec.seq_len, spec.num_logits_to_keep, spec.comp_ctx_lengths)
            if key in self._shapes:
                continue
            entry = entries.get(tuple(sorted(spec.symbols().items())))
            if entry is None:
                raise StageError(
                    f"onnxruntime: {self.program_dir} has no graph for {spec.symbols()}; "
                    "compile the program again"
                )
            if self.graph == "fused" and spec.kind == "decode" and "fused_file" in entry:
                if key[:3] not in fused_shapes:
                    if mode == "dynamic":
                        batch = spec.batch_size
                        if batch not in fused_dynamic:
                            fused_dynamic[batch] = open_graph(fused["dynamic"][str(batch)])
                        session = fused_dynamic[batch]
                    else:
                        session = open_graph(entry["fused_file"])
                    fused_shapes[key[:3]] = self._bind_fused(spec, session)
                self._shapes[key] = fused_shapes[key[:3]]
            else:
                session = dynamic if dynamic is not None else open_graph(entry["file"])
                self._shapes[key] = self._bind(spec, session)
            self._ccls.setdefault(key[:3], []).append(spec.comp_ctx_lengths)
        for ccls in self._ccls.values():
            ccls.sort(key=lambda c: -1 if c is None else c)

    # -- setup -------------------------------------------------------------------------------

    def _build_kv(self, dtype) -> None:
        """Zeroed KV arrays and the OrtValues that wrap them (shared by every specialization)."""
        import onnxruntime as ort

        info_shape = None
        self.kv: dict[str, np.ndarray] = {}
        self.kv_values: dict[str, Any] = {}
        for name in self.kv_inputs:
            if info_shape is None:
                info_shape = self._kv_shape(name)
            array = np.zeros(info_shape, dtype=dtype)
            self.kv[name] = array
            if self.device == "cpu":
                # On CPU the OrtValue shares the numpy memory: updates are visible in self.kv.
                self.kv_values[name] = ort.OrtValue.ortvalue_from_numpy(array)
            else:
                self.kv_values[name] = ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0)

    def _kv_shape(self, name: str) -> tuple[int, int, int, int]:
        import onnx

        graph = onnx.load(str(self.program_dir / self.manifest["dynamic"]["file"]), load_external_data=False)
        for value in graph.graph.input:
            if value.name == name:
                dims = value.type.tensor_type.shape.dim
                return (self.kv_batch_size, dims[1].dim_value, self.kv_slots, dims[3].dim_value)
        raise StageError(f"onnxruntime: {name} is not an input of {self.program_dir}; compile again")

    def _output_shape(self, name: str, spec: Specialization) -> tuple[int, ...]:
        """The shape of a non-KV output under ``spec`` (logits default to [b, nlk, vocab])."""
        dims = self.manifest.get("output_shapes", {}).get(name)
        if dims is None:
            return (spec.batch_size, spec.num_logits_to_keep, self.vocab_size)
        symbols = spec.symbols()
        return tuple(symbols[d] if isinstance(d, str) else int(d) for d in dims)

    def _bind(self, spec: Specialization, session) -> _Shape:
        """An IO binding with the KV cache in place and output buffers of this shape."""
        binding = session.io_binding()
        logits = np.zeros(self._output_shape("logits", spec), dtype=np.float32)
        extra = {name: np.zeros(self._output_shape(name, spec), dtype=np.float32)
                 for name in self.manifest.get("output_shapes", {}) if name != "logits"}
        if self.in_place:
            for name in self.kv_inputs:
                binding.bind_ortvalue_input(name, self.kv_values[name])
                binding.bind_ortvalue_output(f"{name}_RetainedState", self.kv_values[name])
            for name, buffer in [("logits", logits), *extra.items()]:
                binding.bind_output(name, "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
        nlk_input = np.zeros((spec.num_logits_to_keep, 1), dtype=np.int64)
        ccl = None if spec.comp_ctx_lengths is None else np.zeros(spec.comp_ctx_lengths, dtype=np.int64)
        return _Shape(spec, session, binding, logits, nlk_input, extra, ccl)

    def _bind_fused(self, spec: Specialization, session) -> _Shape:
        """An IO binding of the fused graph: each batch row's cache bound in place as its own input
        and output (a row of the shared array is contiguous: a view, no copy)."""
        import onnxruntime as ort

        from spdflow_ort.fused import row_input

        binding = session.io_binding()
        for name in self.kv_inputs:
            kind, layer = name[len("past_"):].split(".")
            for row in range(spec.batch_size):
                value = self._row_values.get((name, row))
                if value is None:
                    view = self.kv[name][row:row + 1]
                    value = self._row_values[(name, row)] = (ort.OrtValue.ortvalue_from_numpy(view), view)
                port = row_input(kind, int(layer), row)
                binding.bind_ortvalue_input(port, value[0])
                binding.bind_ortvalue_output(f"{port}_RetainedState", value[0])
        logits = np.zeros((spec.batch_size, spec.num_logits_to_keep, self.vocab_size), dtype=np.float32)
        binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        nlk_input = np.zeros((spec.num_logits_to_keep, 1), dtype=np.int64)
        return _Shape(spec, session, binding, logits, nlk_input, {}, None, fused=True)

    def _check_fused_positions(self, positions: np.ndarray) -> None:
        """The fused graph writes a row's keys at consecutive slots from its first position
        (spdflow_ort.fused): refuse positions that are not consecutive with -1 only at the end."""
        valid = positions >= 0
        consecutive = positions[:, :1] + np.arange(positions.shape[1])
        if (np.any(valid[:, 1:] & ~valid[:, :-1]) or np.any(valid & (positions != consecutive))
                or np.any(positions >= self.ctx_len)):
            raise StageError(
                "onnxruntime: the fused decode graph needs each row's positions consecutive from its first, "
                f"below ctx_len {self.ctx_len}, with -1 only at the end (got {positions.tolist()}); "
                "set devices.with.graph: reference"
            )

    # -- running -----------------------------------------------------------------------------

    def _select(self, batch: int, seq_len: int, num_logits_to_keep: int, positions: np.ndarray) -> _Shape:
        ccls = self._ccls.get((batch, seq_len, num_logits_to_keep))
        shape = None
        if ccls is not None:
            ccl = None if ccls[0] is None else pick_ccl(positions, ccls)
            shape = self._shapes.get((batch, seq_len, num_logits_to_keep, ccl))
        if shape is None:
            allowed = ", ".join(
                f"(batch {b}, seq_len {s}, num_logits_to_keep {n})" for b, s, n in self._ccls
            )
            raise StageError(
                f"onnxruntime: no compiled shape for batch {batch}, seq_len {seq_len}, "
                f"num_logits_to_keep {num_logits_to_keep}; compiled shapes: {allowed}"
            )
        return shape

    def _batch_index(self, batch_index, batch: int) -> np.ndarray | None:
        if not self.continuous_batching:
            if batch_index is not None:
                raise StageError(
                    "onnxruntime: batch_index was given but the program was compiled without "
                    "continuous batching; set specialization.full_batch_size or drop batch_index"
                )
            return None
        if batch_index is None:
            batch_index = np.arange(batch).reshape(batch, 1)  # rows 0..b-1, like a plain batch
        index = np.ascontiguousarray(batch_index, dtype=np.int64).reshape(batch, 1)
        if index.min() < 0 or index.max() >= self.kv_batch_size:
            raise StageError(
                f"onnxruntime: batch_index {index.ravel().tolist()} is outside the KV cache's "
                f"{self.kv_batch_size} rows (full_batch_size)"
            )
        return index

    def run(self, input_ids, position_ids, num_logits_to_keep: int, batch_index=None) -> np.ndarray:
        """Run one step; returns logits [batch, num_logits_to_keep, vocab] (a reused buffer)."""
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        positions = np.ascontiguousarray(position_ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape != positions.shape:
            raise StageError(
                f"onnxruntime: input_ids {ids.shape} and position_ids {positions.shape} must be "
                "2-D arrays of the same shape [batch, seq_len]"
            )
        shape = self._select(ids.shape[0], ids.shape[1], int(num_logits_to_keep), positions)
        index = self._batch_index(batch_index, ids.shape[0])
        if not self.in_place:
            return self._run_copying(shape, ids, positions, index)
        binding = shape.binding
        if shape.fused:
            self._check_fused_positions(positions)
            binding.bind_cpu_input("input_ids", ids)
            binding.bind_cpu_input("position_ids", positions)
            binding.bind_cpu_input("num_logits_to_keep", shape.nlk_input)
            self._last_inputs = (ids, positions, index)
            shape.session.run_with_iobinding(binding)
            self._last_shape = shape
            return shape.logits
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("position_ids", positions)
        binding.bind_cpu_input("num_logits_to_keep", shape.nlk_input)
        if shape.ccl_input is not None:
            binding.bind_cpu_input("comp_ctx_lengths", shape.ccl_input)
        if index is not None:
            binding.bind_cpu_input("batch_index", index)
        # The bound arrays must outlive the run; keep them referenced until the next one.
        self._last_inputs = (ids, positions, index)
        shape.session.run_with_iobinding(binding)
        self._last_shape = shape
        return shape.logits

    def outputs(self) -> dict[str, np.ndarray]:
        """The extra outputs of the last run (e.g. ``hidden_states``); reused buffers."""
        shape = getattr(self, "_last_shape", None)
        return dict(shape.extra) if shape is not None else {}

    def _run_copying(self, shape: _Shape, ids, positions, index) -> np.ndarray:
        """Plain run(): KV in, retained state out, copied back into the cache arrays."""
        feeds = {"input_ids": ids, "position_ids": positions, "num_logits_to_keep": shape.nlk_input}
        feeds.update(self.kv)
        if shape.ccl_input is not None:
            feeds["comp_ctx_lengths"] = shape.ccl_input
        if index is not None:
            feeds["batch_index"] = index
        names = [o.name for o in shape.session.get_outputs()]
        outputs = dict(zip(names, shape.session.run(None, feeds)))
        for name in self.kv_inputs:
            self.kv[name] = outputs[f"{name}_RetainedState"]  # the next run feeds them back
        shape.logits[...] = outputs["logits"]
        for name, buffer in shape.extra.items():
            buffer[...] = outputs[name]
        self._last_shape = shape
        return shape.logits

    # -- state -------------------------------------------------------------------------------

    def kv_cache(self) -> dict[str, np.ndarray]:
        """The KV cache by input name (views of the live arrays on CPU; copies on CUDA)."""
        if self.device == "cpu":
            return dict(self.kv)
        return {name: value.numpy() for name, value in self.kv_values.items()}

    def reset(self) -> None:
        """Zero the whole KV cache (not needed between requests: stale slots are masked)."""
        for array in self.kv.values():
            array.fill(0)
        if self.device != "cpu":
            for name, value in self.kv_values.items():
                value.update_inplace(self.kv[name])

    def runtime_facts(self) -> dict:
        """What this session runs with: its thread pool and the threads in effect (see
        :class:`OrtEnvironment`), execution provider and mode; recorded in the run report."""
        facts = {**ENVIRONMENT.describe(self.threads_requested, self.shared_threads),
                 "spinning": self.shared_threads,
                 "execution_provider": self.execution_provider, "session_mode": self.mode,
                 "graph": self.graph}
        if self.graph == "fused":
            facts["graph_note"] = (f"decode steps ran the fused graph, prefill the reference graph; KV cache of "
                                   f"{self.kv_slots} slots")
        if self.shared_threads and not self.spinning_requested:
            facts["spinning_note"] = f"spinning off was asked for, but {POOL_ALREADY_SPINS}"
        return facts

    def close(self) -> None:
        """Release the sessions and the KV cache."""
        self._shapes.clear()
        self._row_values.clear()
        self.kv_values.clear()
        self.kv.clear()
