"""The onnxruntime backend's compile step: the ``qpc-<hash>/`` directory for ONNX Runtime.

Same layout as a QAIC compile (DESIGN §4): specializations.json, custom_io.yaml (exactly what
qaic-compile would get), hashed_compile_params.json, qconfig.json and ``qpc/``. Here ``qpc/``
holds one static-shape graph per specialization plus the dynamic graph, all pointing at ONE
weights file (hard-linked from the export when possible), and ``qpc/manifest.json``, written
last, marks a finished build.

onnx and onnxruntime are imported inside functions: lint loads every plugin.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from spdflow.api import Backend, CompiledProgram, CompileRequest, Specialization
from spdflow.engine import cache
from spdflow.engine.cache import build_lock
from spdflow.errors import StageError
from spdflow.files import atomic_dir, sha256_file, short_hash, write_json_atomic, write_text_atomic
from spdflow_ort.config import OrtConfig
from spdflow_ort.fused import FUSED_VERSION, FUSED_WEIGHTS, fused_problem, kv_slots
from spdflow_ort.lowering import LOWERING_VERSION, lower_custom_ops

BACKEND_NAME = "onnxruntime"
#: Bumped when the layout of qpc/ changes, so old cache entries are not trusted.
PROGRAM_FORMAT = 1
MANIFEST = "manifest.json"
WEIGHTS = "model.onnx.data"
DYNAMIC_GRAPH = "model.onnx"

_ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}


@dataclass
class OrtProgram(CompiledProgram):
    """A CompiledProgram plus the runtime choices of the recipe's ``devices.with:`` block."""

    session_mode: str = "static"
    session_mode_reason: str = ""
    execution_provider: str = "cpu"
    threads: int | None = None
    spinning: bool = True
    spinning_reason: str = ""
    #: the graph decode steps run: "reference" (the exported one) or "fused" (see fused.py)
    graph: str = "reference"


def spec_file_name(spec: Specialization) -> str:
    """The graph file of one specialization, e.g. ``decode_k4_b1_s5_n5_c512.onnx`` (``_l256``
    after ``_c512`` for a compute context length of 256)."""
    tag = "prefill" if spec.kind == "prefill" else f"decode_k{spec.k}"
    name = f"{tag}_b{spec.batch_size}_s{spec.seq_len}_n{spec.num_logits_to_keep}_c{spec.ctx_len}"
    if spec.comp_ctx_lengths is not None:
        name += f"_l{spec.comp_ctx_lengths}"
    if spec.full_batch_size is not None:
        name += f"_f{spec.full_batch_size}"
    return name + ".onnx"


def _weight_locations(graph) -> set[str]:
    """The external-data files the graph's initializers point at."""
    locations = set()
    for tensor in graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                locations.add(entry.value)
    return locations


def _kv_dtype(graph) -> str:
    """The model dtype as custom_io.yaml needs it, read from the past_key.0 input."""
    for value in graph.input:
        if value.name == "past_key.0":
            return _ONNX_DTYPES.get(value.type.tensor_type.elem_type, "float32")
    raise StageError(
        "onnxruntime compile: the ONNX has no past_key.0 input; re-export it with the spdflow export stage"
    )


def compile_params(request: CompileRequest, graph_digest: str, data_bytes: int, custom_io,
                   fused: dict | None = None) -> dict:
    """Everything the program depends on; its short hash names the qpc dir."""
    params = {
        "backend": BACKEND_NAME,
        "program_format": PROGRAM_FORMAT,
        "lowering": LOWERING_VERSION,
        "onnx": {"name": request.onnx_path.name, "graph_sha256": graph_digest, "data_bytes": data_bytes},
        "role": request.role,
        "continuous_batching": request.continuous_batching,
        "num_speculative_tokens": sorted(set(request.num_speculative_tokens)),
        "specializations": [spec.symbols() for spec in request.specializations],
        # onnxruntime reads no specializations.json; kept so existing cache keys stay valid.
        "specializations_format": "flat",
        "custom_io": [list(entry) for entry in custom_io],
    }
    if fused is not None:  # only then: reference programs keep their existing keys
        params["fused_graph"] = fused
    return params


def _extra_outputs(graph) -> list[str]:
    """Target outputs beyond 3-D logits and the retained KV (what a proposer asked the export for)."""
    extra = [v.name for v in graph.output if v.name != "logits" and not v.name.endswith("_RetainedState")]
    for value in graph.output:
        if value.name == "logits" and len(value.type.tensor_type.shape.dim) == 4:
            extra.append("head_logits")
    return extra


def _source_fingerprint(source_dir: Path) -> list:
    """Names, sizes and mtimes of the HF files the fused graph reads its weights from."""
    files = sorted(p for p in Path(source_dir).iterdir()
                   if p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name == "config.json"))
    return [[p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in files]


def decode_graph(request: CompileRequest) -> str:
    """The graph the program's decode steps run: the recipe's ``graph`` for the target; a draft
    model's program stays on the reference graph (its catch-up steps feed left-padded rows, whose
    positions GroupQueryAttention cannot place)."""
    return ort_config(request).graph if request.role == "target" else "reference"


def fused_params(request: CompileRequest, model) -> dict | None:
    """The fused graph's part of the compile key, or None for the reference graph; StageError
    with what to do when the program cannot have it."""
    config = ort_config(request)
    if decode_graph(request) != "fused":
        return None
    info = request.model_info
    problem = fused_problem(model_type=info.model_type, continuous_batching=request.continuous_batching,
                            kv_dtype=_kv_dtype(model.graph), execution_provider=config.execution_provider,
                            extra_outputs=_extra_outputs(model.graph), head_dim=info.head_dim)
    if problem is not None:
        raise StageError(f"onnxruntime compile: {problem}")
    source = Path(info.source_dir)
    if not (source / "config.json").is_file():
        raise StageError(f"onnxruntime compile: the fused graph reads the model's weights from {source}, which has "
                         "no config.json; run the export stage again or set devices.with.graph: reference")
    ctx_len = request.specializations[0].ctx_len
    return {"version": FUSED_VERSION, "kv_slots": kv_slots(ctx_len, request.specializations),
            "source": _source_fingerprint(source)}


def program_is_complete(qpc_dir: Path, *, verify: bool = False) -> bool:
    """True when the program is finished and intact (see :func:`program_problem`)."""
    return program_problem(qpc_dir, verify=verify) is None


def program_problem(qpc_dir: Path, *, verify: bool = False) -> str | None:
    """Why ``qpc_dir`` cannot be trusted, or None when it can.

    It must hold a done marker whose recorded files (graphs, weights, manifest) still match
    (size and mtime, or the full sha256 when those changed or ``verify``), and a manifest of
    this program format naming only files that exist.
    """
    marker, why = cache.read_done(qpc_dir, verify=verify)
    if marker is None:
        return why
    manifest_path = qpc_dir / "qpc" / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = [manifest["weights"], manifest["dynamic"]["file"]]
        files += [graph["file"] for graph in manifest["graphs"]]
        fused = manifest.get("fused")
        if fused is not None:
            files += [fused["weights"], *fused["dynamic"].values()]
            files += [graph["fused_file"] for graph in manifest["graphs"] if "fused_file" in graph]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no valid qpc/{MANIFEST}"
    if manifest.get("format") != PROGRAM_FORMAT:
        return "it was built by another program format"
    recorded = marker["files"]
    for name in files:
        if f"qpc/{name}" not in recorded:
            return f"'qpc/{name}' is not in its done marker"
    return None


def _fix_dims(model, symbols: dict[str, int]) -> None:
    """Replace each dim_param bound by ``symbols`` with its value on graph inputs and outputs."""
    for value in list(model.graph.input) + list(model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in symbols:
                dim.dim_value = symbols[dim.dim_param]  # setting dim_value clears dim_param


def _place_weights(source: Path, target: Path) -> str:
    """Hard-link (else copy) the export's weights file into qpc/; returns how."""
    try:
        os.link(source, target)
        return "hardlink"
    except OSError:
        shutil.copyfile(source, target)
        return "copy"


def build_program(request: CompileRequest, work: Path, model, params: dict, custom_io) -> None:
    """Write the whole qpc-<hash> layout into ``work`` (a temp dir renamed by the caller)."""
    import onnx
    import onnxruntime

    from spdflow_qaic.formats import render_custom_io, specializations_document

    specs = request.specializations
    write_json_atomic(work / "specializations.json", specializations_document(specs))
    write_text_atomic(work / "custom_io.yaml", render_custom_io(custom_io))
    write_json_atomic(work / "hashed_compile_params.json", params)
    write_json_atomic(work / "qconfig.json", _qconfig(request, onnxruntime.__version__))

    program = work / "qpc"
    program.mkdir()
    source = Path(request.onnx_path)
    locations = _weight_locations(model.graph)
    if len(locations) == 1:
        how = _place_weights(source.parent / next(iter(locations)), program / WEIGHTS)
        # Keep every initializer's location relative and pointing at the one shared file.
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = WEIGHTS
    else:
        # Weights inline (or spread over several files): write them once as the shared file.
        staging = program / "_staging.onnx"
        onnx.save_model(onnx.load(str(source)), str(staging), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=WEIGHTS)
        model = onnx.load(str(staging), load_external_data=False)
        staging.unlink()
        how = "rewritten"
    request.progress(f"weights placed in qpc/ ({how})")
    lower_custom_ops(model)

    fused = params.get("fused_graph")
    # With the fused graph the cache has kv_slots slots (fused.py); the reference graphs say so too.
    slots = {"ctx_len": fused["kv_slots"]} if fused else {}
    onnx.save_model(model, str(program / DYNAMIC_GRAPH))
    graphs = []
    for number, spec in enumerate(specs, 1):
        request.progress(f"specialization {number}/{len(specs)}: {spec.kind} "
                         + " ".join(f"{k}={v}" for k, v in spec.symbols().items()))
        fixed = onnx.ModelProto()
        fixed.CopyFrom(model)
        _fix_dims(fixed, {**spec.symbols(), **slots})
        name = spec_file_name(spec)
        onnx.save_model(fixed, str(program / name))
        graphs.append({"file": name, "kind": spec.kind, "k": spec.k, "symbols": spec.symbols()})
    request.progress(f"wrote {len(graphs)} static-shape graphs")
    fused_manifest = _write_fused(request, program, graphs, fused["kv_slots"]) if fused else None
    manifest = {
        "format": PROGRAM_FORMAT,
        "backend": BACKEND_NAME,
        "weights": WEIGHTS,
        "dynamic": {"file": DYNAMIC_GRAPH},
        "graphs": graphs,
        "inputs": [value.name for value in model.graph.input],
        "outputs": [value.name for value in model.graph.output],
        # Shapes of the outputs the session allocates (symbols as names), e.g. 4-D logits.
        "output_shapes": {value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
                          for value in model.graph.output if not value.name.endswith("RetainedState")},
        "kv_dtype": _kv_dtype(model.graph),
        "continuous_batching": request.continuous_batching,
    }
    if fused_manifest is not None:
        manifest["fused"] = fused_manifest
    write_json_atomic(program / MANIFEST, manifest)
    cache.write_done(work, {"key": short_hash(params)})  # last: marks the program complete


def _write_fused(request: CompileRequest, program: Path, graphs: list[dict], slots: int) -> dict:
    """Write the fused decode graphs (one per decode batch size, plus one static-shape copy per
    decode specialization) and their weights file; the manifest's ``fused`` entry. Adds
    ``fused_file`` to the decode entries of ``graphs``."""
    import gc

    import onnx

    from spdflow_ort.fused import FusedModel, load_source_model

    request.progress(f"fused graph: reading the weights of {request.model_info.source_dir}")
    hf_model = load_source_model(Path(request.model_info.source_dir))
    fused = FusedModel(hf_model, slots, program / FUSED_WEIGHTS)
    del hf_model
    gc.collect()
    dynamic: dict[str, str] = {}
    for entry in graphs:
        if entry["kind"] != "decode":
            continue
        symbols = entry["symbols"]
        batch = symbols["batch_size"]
        model = fused.graph(batch)
        if str(batch) not in dynamic:
            dynamic[str(batch)] = f"fused_b{batch}.onnx"
            onnx.save_model(model, str(program / dynamic[str(batch)]))
        _fix_dims(model, {"seq_len": symbols["seq_len"], "num_logits_to_keep": symbols["num_logits_to_keep"]})
        entry["fused_file"] = "fused_" + entry["file"]
        onnx.save_model(model, str(program / entry["fused_file"]))
    request.progress(f"fused graph: {len(dynamic)} dynamic and {sum('fused_file' in g for g in graphs)} "
                     f"static-shape decode graphs, {slots} KV slots")
    return {"version": FUSED_VERSION, "weights": FUSED_WEIGHTS, "kv_slots": slots, "dynamic": dynamic}


def _qconfig(request: CompileRequest, ort_version: str) -> dict:
    """Human-facing record of what was built: model config, K-list, shapes, backend versions."""
    info = request.model_info
    config_path = Path(info.source_dir) / "config.json"
    try:
        model_config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        model_config = None
    config = ort_config(request)
    return {
        "model": {
            "name": info.name,
            "model_type": info.model_type,
            "vocab_size": info.vocab_size,
            "num_layers": info.num_layers,
            "num_kv_heads": info.num_kv_heads,
            "head_dim": info.head_dim,
            "config": model_config,
        },
        "role": request.role,
        "num_speculative_tokens": sorted(set(request.num_speculative_tokens)),
        "continuous_batching": request.continuous_batching,
        "specializations": [
            {"kind": spec.kind, "k": spec.k, "symbols": spec.symbols()} for spec in request.specializations
        ],
        "backend": {"name": BACKEND_NAME, "onnxruntime_version": ort_version},
        # Runtime defaults at build time; sessions prefer what the current recipe says.
        "devices": config.model_dump(mode="json"),
    }


#: session_mode auto picks static while the extra weight copies of one session per shape stay
#: below this; measured: SmolLM2-135M fp32 (513 MiB of weights, 5 shapes) peaks at 3,297 MiB static
#: vs 740 MiB dynamic, while the embedded 4M model's dynamic step costs ~40 % more than static.
AUTO_STATIC_EXTRA_BYTES = 256 * 1024 * 1024


def _weights_bytes(qpc_dir: Path) -> int:
    """Size of the program's weights file (0 when it has none)."""
    weights = Path(qpc_dir) / "qpc" / WEIGHTS
    return weights.stat().st_size if weights.is_file() else 0


def resolve_session_mode(mode: str, qpc_dir: Path, specializations) -> tuple[str, str]:
    """(static or dynamic, why) for the recipe's ``session_mode``."""
    if mode != "auto":
        return mode, "set in devices.with"
    size = _weights_bytes(qpc_dir)
    sessions = len({(s.batch_size, s.seq_len, s.num_logits_to_keep) for s in specializations})
    extra = size * max(sessions - 1, 0)
    mib = extra / 2**20
    if extra <= AUTO_STATIC_EXTRA_BYTES:
        return "static", f"auto: {sessions} static sessions add {mib:,.0f} MiB of weight copies, within 256 MiB"
    return "dynamic", f"auto: {sessions} static sessions would add {mib:,.0f} MiB of weight copies"


#: spinning auto keeps ORT's spinning pool for models below this many bytes of weights, and for
#: bigger ones when the machine is quiet (see OrtConfig.spinning and benchmarks/README.md,
#: "Threads and spinning").
AUTO_SPINNING_MAX_BYTES = 64 * 1024 * 1024


def _machine_load() -> tuple[float, int]:
    """(1-minute load average, cores); load 0 where the platform has no load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return float(load), os.cpu_count() or 1


def resolve_spinning(setting: str, qpc_dir: Path, machine: tuple[float, int] | None = None) -> tuple[bool, str]:
    """(spin or not, why) for the recipe's ``spinning``; ``machine`` is (load, cores), read
    from the OS when not given. auto spins for small models, and for big ones only while fewer
    than half the cores are busy: on SmolLM2 a spinning pool was 1.2-1.3x faster than a sleeping
    one on an idle machine and 1.5-2x slower at load 3-6 on 2 cores."""
    if setting != "auto":
        return setting == "on", "set in devices.with"
    size = _weights_bytes(qpc_dir)
    mib = size / 2**20
    if size < AUTO_SPINNING_MAX_BYTES:
        return True, f"auto: {mib:,.0f} MiB of weights, under 64 MiB"
    load, cores = machine or _machine_load()
    if load < cores / 2:
        return True, f"auto: {mib:,.0f} MiB of weights on a quiet machine (load {load:.1f} on {cores} cores)"
    return False, f"auto: {mib:,.0f} MiB of weights on a busy machine (load {load:.1f} on {cores} cores)"


def spinning_line(spinning: bool, why: str) -> str:
    """The compile stage's line on thread spinning. Off cannot be had once an earlier session of
    this process made ORT's process-wide pool (ORT then allows no other, and its threads spin):
    the line says so rather than "off" (a bench's later batch sizes, each a new program, met this)."""
    from spdflow_ort.session import ENVIRONMENT, POOL_ALREADY_SPINS

    if not spinning and ENVIRONMENT.pool_made:
        return f"thread spinning on ({why} gave off, but {POOL_ALREADY_SPINS})"
    return f"thread spinning {'on' if spinning else 'off'} ({why})"


def ort_config(request: CompileRequest) -> OrtConfig:
    """The request's validated ``devices.with:`` block (defaults when none was given)."""
    return request.backend_config if request.backend_config is not None else OrtConfig()


class OrtBackend(Backend):
    """ONNX Runtime, the CPU reference backend (CUDA EP where installed)."""

    name = BACKEND_NAME

    @property
    def version(self) -> str:  # type: ignore[override]
        try:
            import onnxruntime
        except ImportError:
            return "0"
        return onnxruntime.__version__

    def unavailable_reason(self) -> str | None:
        # find_spec, not import: lint asks every backend and must stay free of onnxruntime.
        import importlib.util

        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed; install it with `pip install onnxruntime`"
        return None

    def compile(self, request: CompileRequest) -> OrtProgram:
        """Build ``export_dir/qpc-<key>/`` unless a complete one exists (then it is reused)."""
        import onnx

        from spdflow_qaic.formats import custom_io_entries

        onnx_path = Path(request.onnx_path)
        if not onnx_path.is_file():
            raise StageError(
                f"onnxruntime compile: {onnx_path} does not exist; run the export stage again"
            )
        model = onnx.load(str(onnx_path), load_external_data=False)
        custom_io = custom_io_entries(request.model_info, _kv_dtype(model.graph), False)
        locations = _weight_locations(model.graph)
        data_bytes = sum((onnx_path.parent / loc).stat().st_size for loc in sorted(locations)
                         if (onnx_path.parent / loc).is_file())
        params = compile_params(request, sha256_file(onnx_path), data_bytes, custom_io,
                                fused_params(request, model))
        key = short_hash(params)
        qpc_dir = Path(request.export_dir) / f"qpc-{key}"
        with build_lock(qpc_dir):  # runs sharing a cache build each program once
            return self._build(request, model, params, custom_io, key, qpc_dir)

    def _build(self, request: CompileRequest, model, params: dict, custom_io, key: str, qpc_dir: Path) -> OrtProgram:
        problem = None if request.force else program_problem(qpc_dir, verify=request.verify)
        if not request.force and problem is None:
            return self._program(request, qpc_dir, key, cached=True, reason=f"key {key}")
        if request.force:
            why = "forced rebuild"
        elif qpc_dir.exists():
            why = f"rebuilt: qpc-{key} was not trusted ({problem})"
            request.warn(f"program qpc-{key} is not trusted ({problem}); rebuilding")
        else:
            why = "no program for this key"
        request.progress(f"building qpc-{key} ({len(request.specializations)} specializations)")
        started = time.monotonic()
        with atomic_dir(qpc_dir) as work:
            build_program(request, work, model, params, custom_io)
        reason = f"{why}; built in {time.monotonic() - started:.2f} s"
        return self._program(request, qpc_dir, key, cached=False, reason=reason)

    def describe_compile(self, request: CompileRequest, *, exported: bool) -> list[str]:
        """No compiler runs: the compile stage writes one static-shape graph per specialization."""
        where = f"{request.export_dir}/qpc-<hash of the export>"
        return [f"program dir: {where}",
                "compile command: none (onnxruntime): one static-shape ONNX per specialization in qpc/, "
                "sharing the export's weights file"]

    @staticmethod
    def _program(request: CompileRequest, qpc_dir: Path, key: str, *, cached: bool, reason: str) -> OrtProgram:
        config = ort_config(request)
        mode, why = resolve_session_mode(config.session_mode, qpc_dir, request.specializations)
        request.progress(f"session mode {mode} ({why})")
        spinning, spin_why = resolve_spinning(config.spinning, qpc_dir)
        request.progress(spinning_line(spinning, spin_why))
        graph = decode_graph(request)
        request.progress(f"decode graph: {graph}" + (" (a draft model's program)" if graph != config.graph else ""))
        return OrtProgram(
            backend=BACKEND_NAME,
            qpc_dir=qpc_dir,
            key=key,
            cached=cached,
            reason=reason,
            specializations=list(request.specializations),
            model_info=request.model_info,
            session_mode=mode,
            session_mode_reason=why,
            execution_provider=config.execution_provider,
            threads=config.threads,
            spinning=spinning,
            spinning_reason=spin_why,
            graph=graph,
        )

    def open_session(self, program: CompiledProgram, *, threads: int | None = None):
        """An :class:`~spdflow_ort.session.OrtSession` on the program, its KV cache zeroed.

        Mode, execution provider and threads come from the program (the recipe's
        ``devices.with:``); ``threads`` overrides the thread count.
        """
        from spdflow_ort.session import OrtSession

        qpc_dir = Path(program.qpc_dir)
        problem = program_problem(qpc_dir)
        if problem is not None:
            raise StageError(
                f"onnxruntime: {qpc_dir} holds no trusted program ({problem}); run the compile stage again"
            )
        defaults = _recorded_devices(qpc_dir)
        spinning = getattr(program, "spinning", None)  # a plain CompiledProgram has none: qconfig's
        if spinning is None:
            spinning = resolve_spinning(defaults.get("spinning", "auto"), qpc_dir)[0]
        return OrtSession(
            qpc_dir / "qpc",
            specializations=program.specializations,
            vocab_size=program.model_info.vocab_size,
            mode=getattr(program, "session_mode", None)
            or resolve_session_mode(defaults.get("session_mode", "auto"), qpc_dir, program.specializations)[0],
            execution_provider=getattr(program, "execution_provider", None)
            or defaults.get("execution_provider", "cpu"),
            threads=threads or getattr(program, "threads", None) or defaults.get("threads"),
            shared_threads=spinning,
        )


def _recorded_devices(qpc_dir: Path) -> dict:
    # A plain CompiledProgram (built elsewhere) carries no runtime choices: use qconfig.json's.
    try:
        recorded = json.loads((qpc_dir / "qconfig.json").read_text(encoding="utf-8"))["devices"]
        return recorded if isinstance(recorded, dict) else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
