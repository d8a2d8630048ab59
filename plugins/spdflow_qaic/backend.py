"""The qaic backend: builds the files and command of DESIGN §4 and runs qaic-compile.

The compiler is an external program, so everything here is testable with a fake one
(``$QAIC_COMPILER``). The runtime (qaicrt) is imported only when a session is opened.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spdflow.api import Backend, CompiledProgram, CompileRequest, Session
from spdflow.engine import cache
from spdflow.engine.cache import build_lock
from spdflow.errors import BackendUnavailableError, StageError
from spdflow.files import short_hash, write_text_atomic
from spdflow_qaic.config import QaicConfig
from spdflow_qaic.formats import (
    PROGRAM_MARKER,
    custom_io_entries,
    mdp_config,
    mdp_file_name,
    render_custom_io,
    specializations_document,
)

SDK_ROOT = Path("/opt/qti-aic")
#: Environment variable that overrides the compiler path (a fake one in tests).
COMPILER_ENV = "QAIC_COMPILER"
#: Environment variable that overrides the path of qaic-util (hardware detection).
UTIL_ENV = "QAIC_UTIL"
#: Flags spdflow derives from the devices section; setting them in compiler_options would
#: pass them twice with possibly different values.
RESERVED_OPTIONS = {
    "aic-hw", "aic-hw-version", "m", "compile-only", "retained-state", "convert-to-fp16",
    "aic-num-cores", "mxfp6-matmul", "mdp-load-partition-config",
    "network-specialization-config", "custom-io-list-file", "aic-binary-dir",
}
STDERR_TAIL_LINES = 20
#: ONNX graphs up to this size are hashed by content; larger ones (weights embedded) by name
#: and size, since the export dir they live in is itself content-addressed.
ONNX_DIGEST_LIMIT = 64 * 1024 * 1024


@dataclass
class CompilePlan:
    """Everything one compile writes and runs, computed before touching the disk."""

    qpc_dir: Path
    key: str
    compiler: Path
    command: list[str]
    params: dict
    files: dict[str, str]  # file name inside qpc_dir -> text
    script: str

    @property
    def marker(self) -> Path:
        return self.qpc_dir / "qpc" / PROGRAM_MARKER


# ----------------------------------------------------------------------------- the command


def compiler_path(compiler: str) -> Path:
    """$QAIC_COMPILER when set, else the SDK's qaic-compile (or legacy qaic-exec)."""
    override = os.environ.get(COMPILER_ENV)
    return Path(override) if override else SDK_ROOT / "exec" / compiler


def compiler_available(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def qaic_config(request: CompileRequest) -> QaicConfig:
    """The request's validated ``devices.with:`` block (defaults when none was given)."""
    return request.backend_config if request.backend_config is not None else QaicConfig()


def model_dtype(request: CompileRequest) -> str:
    """The weight dtype: CompileRequest.dtype, else a dtype on ModelInfo, else float32."""
    return getattr(request, "dtype", None) or getattr(request.model_info, "dtype", None) or "float32"


def option_flag(key: str, value: Any) -> str | None:
    """One compiler_options item as QEfficient spells it: key -> -key-with-dashes."""
    name = "-" + key.lstrip("-").replace("_", "-")
    if value is True:
        return name
    if value is False or value is None:
        return None
    return f"{name}={value}"


def extra_option_flags(options: dict[str, Any]) -> list[str]:
    """The recipe's extra compiler_options, refusing the ones spdflow sets itself."""
    flags = []
    for key, value in options.items():
        normalized = key.lstrip("-").replace("_", "-").lower()
        if normalized in RESERVED_OPTIONS:
            raise StageError(
                f"devices.with.compiler_options sets {key!r}, which spdflow derives itself; "
                "remove it and use the matching devices.with field (num_cores, mxfp6_matmul, ...)"
            )
        flag = option_flag(key, value)
        if flag is not None:
            flags.append(flag)
    return flags


@functools.lru_cache(maxsize=None)
def detect_hw_version(util: str) -> str:
    """ai200 when ``qaic-util -q`` reports an AIC200 firmware image, else (or on any error) ai100."""
    try:
        result = subprocess.run([util, "-q"], capture_output=True, text=True, timeout=10,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return "ai100"
    variants = [line for line in result.stdout.splitlines() if "IMAGE_VARIANT" in line]
    return "ai200" if any("AIC200" in line for line in variants) else "ai100"


def hw_version(config: QaicConfig) -> str:
    """The -aic-hw-version value: the configured one, or the detected one for 'auto'."""
    if config.aic_hw_version != "auto":
        return config.aic_hw_version
    return detect_hw_version(os.environ.get(UTIL_ENV) or str(SDK_ROOT / "tools" / "qaic-util"))


def program_shapes(request: CompileRequest) -> list:
    """The shapes this program holds: all, or only prefill / only decode (disaggregated serving)."""
    programs = qaic_config(request).programs
    if programs == "both":
        return list(request.specializations)
    return [spec for spec in request.specializations if spec.kind == programs]


def user_mdp_file(request: CompileRequest) -> tuple[str, str] | None:
    """(file name, text) of the user's MDP partition config, or None; a StageError if unreadable."""
    name = qaic_config(request).mdp_partition_file
    if name is None:
        return None
    path = Path(name).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
        json.loads(text)
    except (OSError, ValueError) as exc:
        raise StageError(
            f"devices.with.mdp_partition_file '{name}' cannot be used ({type(exc).__name__}: {exc}); "
            "point it at a readable MDP partition config in JSON"
        ) from None
    return path.name, text


def option_flags(request: CompileRequest) -> list[str]:
    """The flags that do not name a file: -aic-hw ... extras (QEfficient steps 1-6)."""
    config = qaic_config(request)
    flags = ["-aic-hw", f"-aic-hw-version={hw_version(config)}"]
    if config.compiler == "qaic-exec":
        flags.append("-compile-only")  # qaic-exec runs the program after compiling otherwise
    flags.append("-retained-state")
    if model_dtype(request) in ("float32", "float16"):
        flags.append("-convert-to-fp16")
    if config.mxfp6_matmul:
        flags.append("-mxfp6-matmul")  # QEfficient: right after -convert-to-fp16
    flags.append(f"-aic-num-cores={config.num_cores}")
    flags.extend(extra_option_flags(config.compiler_options))
    if config.sub_functions:
        flags.append("-sub-functions")  # QEfficient step 6, after the options
    return flags


def mdp_flags(request: CompileRequest, qpc_dir: str) -> list[str]:
    """The partition config (QEfficient passes it right after -m=): the user's file, or the
    generated one of a multi-device program."""
    user = user_mdp_file(request)
    if user is not None:
        return [f"-mdp-load-partition-config={qpc_dir}/{user[0]}"]
    num_devices = len(request.devices.device_ids)
    if num_devices > 1:
        return [f"-mdp-load-partition-config={qpc_dir}/{mdp_file_name(num_devices)}"]
    return []


def file_flags(qpc_dir: str) -> list[str]:
    """The flags that name the files inside ``qpc_dir`` (QEfficient steps 9-11)."""
    return [
        f"-network-specialization-config={qpc_dir}/specializations.json",
        f"-custom-IO-list-file={qpc_dir}/custom_io.yaml",
        f"-aic-binary-dir={qpc_dir}/qpc",
    ]


def build_command(request: CompileRequest, compiler: Path, qpc_dir: Path) -> list[str]:
    """The full compiler command, in QEfficient's order (DESIGN §4)."""
    flags = option_flags(request)
    # -m goes right after -aic-hw-version, then the partition config, then the options.
    flags[2:2] = [f"-m={request.onnx_path}", *mdp_flags(request, str(qpc_dir))]
    return [str(compiler), *flags, *file_flags(str(qpc_dir))]


# ------------------------------------------------------------------------------ the key


def onnx_identity(onnx_path: Path) -> dict:
    """What identifies the ONNX in the hash without its absolute path, so folders can move.

    A graph of up to ONNX_DIGEST_LIMIT bytes is identified by its content (its weights live in
    external data named by the graph, inside the content-addressed export dir); a larger one
    by the export dir's name, its file name and size.
    """
    try:
        size = onnx_path.stat().st_size
    except OSError:
        return {"dir": onnx_path.parent.name, "file": onnx_path.name}
    if size <= ONNX_DIGEST_LIMIT:
        return {"file": onnx_path.name, "sha256": hashlib.sha256(onnx_path.read_bytes()).hexdigest()}
    return {"dir": onnx_path.parent.name, "file": onnx_path.name, "size": size}


def compile_params(request: CompileRequest) -> dict:
    """The hashed compile params: everything that changes the program, nothing path-bound.

    The compiler enters by name, not path, so a fake or relocated compiler and a later run
    of compile.sh share the directory. The K-list enters sorted, so [4, 0] == [0, 4].
    """
    config = qaic_config(request)
    device_ids = request.devices.device_ids
    num_devices = len(device_ids)
    return {
        "backend": "qaic",
        "compiler": config.compiler,
        "command": option_flags(request),
        "onnx": onnx_identity(Path(request.onnx_path)),
        "specializations": specializations_document(
            program_shapes(request), config.specializations_format
        ),
        "custom_io": [list(entry) for entry in _custom_io(request)],
        "mdp_ts_num_devices": num_devices,
        "mdp_ts_json": mdp_config(device_ids, config.num_cores) if num_devices > 1 else None,
        "mdp_user_file": list(user) if (user := user_mdp_file(request)) else None,
        "num_speculative_tokens": sorted(set(request.num_speculative_tokens)),
    }


def _custom_io(request: CompileRequest) -> list[tuple[str, str]]:
    return custom_io_entries(request.model_info, model_dtype(request), qaic_config(request).mxint8_kv_cache)


# ------------------------------------------------------------------------------ the files


def dtype_problem(dtype: str, config: QaicConfig) -> str | None:
    """Why the compiler of ``config`` cannot take weights of ``dtype``, or None."""
    if dtype == "bfloat16" and hw_version(config) == "ai100":
        return ("the AI 100 compiler does not take bfloat16 weights; set model.dtype: float32 "
                "(QEfficient loads bf16 models as float32 for ai100 and compiles them with "
                "-convert-to-fp16 and a float16 KV cache)")
    return None


def plan_compile(request: CompileRequest) -> CompilePlan:
    """Compute the key, directory, command and every file text of one compile."""
    problem = dtype_problem(model_dtype(request), qaic_config(request))
    if problem:
        raise StageError(f"cannot compile {request.role} for qaic: {problem}")
    try:
        params = compile_params(request)
    except ValueError as exc:
        raise StageError(f"cannot compile {request.role} for qaic: {exc}") from None
    key = short_hash(params)
    qpc_dir = Path(request.export_dir) / f"qpc-{key}"
    compiler = compiler_path(qaic_config(request).compiler)
    command = build_command(request, compiler, qpc_dir)
    num_devices = params["mdp_ts_num_devices"]
    files = {
        "specializations.json": _json_text(params["specializations"]),
        "custom_io.yaml": render_custom_io(_custom_io(request)),
        "hashed_compile_params.json": _json_text(params),
        "qconfig.json": _json_text(qconfig(request, params, command)),
    }
    if params["mdp_user_file"]:
        name, text = params["mdp_user_file"]
        files[name] = text
    elif num_devices > 1:
        files[mdp_file_name(num_devices)] = _json_text(params["mdp_ts_json"])
    script = compile_script(request, qpc_dir)
    return CompilePlan(qpc_dir, key, compiler, command, params, files, script)


def _json_text(obj: Any) -> str:
    # QEfficient's create_json layout (indent 4, sorted keys, no space after ':'), so the files
    # a compiler reads are byte-identical to QEfficient's; kept as text so the plan is complete
    # before writing.
    return json.dumps(obj, indent=4, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"


def qconfig(request: CompileRequest, params: dict, command: list[str]) -> dict:
    """qconfig.json: how this program was made (model, K-list, shapes, command, SDK versions)."""
    model = {
        name: str(value) if isinstance(value, Path) else value
        for name, value in dataclasses.asdict(request.model_info).items()
    }
    return {
        "backend": "qaic",
        "role": request.role,
        "model": model,
        "dtype": model_dtype(request),
        "continuous_batching": request.continuous_batching,
        "num_speculative_tokens": params["num_speculative_tokens"],
        "specializations": params["specializations"],
        "devices": {"device_ids": list(request.devices.device_ids), **qaic_config(request).model_dump(mode="json")},
        "compiler": {"command": command, "compile_only": request.compile_only},
        "sdk_versions": sdk_versions(),
    }


def sdk_versions(versions_dir: Path = SDK_ROOT / "versions") -> dict[str, dict[str, str]]:
    """Leaf elements of the SDK's version files (apps.xml, platform.xml), when installed."""
    versions: dict[str, dict[str, str]] = {}
    for path in sorted(versions_dir.glob("*.xml")) if versions_dir.is_dir() else []:
        try:
            root = ElementTree.parse(path).getroot()
        except (OSError, ElementTree.ParseError) as exc:
            versions[path.stem] = {"error": str(exc)}
            continue
        leaves = {el.tag: el.text.strip() for el in root.iter() if len(el) == 0 and (el.text or "").strip()}
        versions[path.stem] = leaves
    return versions


def _shell_word(text: str) -> str:
    """Quote for use inside double quotes, where $HERE must still expand."""
    return "".join("\\" + ch if ch in '\\"$`' else ch for ch in text)


def compile_script(request: CompileRequest, qpc_dir: Path) -> str:
    """compile.sh: the same compile in one command, with paths relative to the script.

    The ONNX is named relative to the qpc dir, so copying the export folder (ONNX plus
    qpc-<hash>/) to a QAIC host and running ``sh qpc-<hash>/compile.sh`` reproduces the compile.
    """
    onnx_rel = os.path.relpath(Path(request.onnx_path).resolve(), Path(qpc_dir).resolve())
    flags = [shlex.quote(flag) for flag in option_flags(request)]
    flags[2:2] = ['"-m=$ONNX"', *(f'"{flag}"' for flag in mdp_flags(request, "$HERE"))]
    flags += [f'"{flag}"' for flag in file_flags("$HERE")]
    body = " \\\n    ".join(['"$COMPILER"', *flags, '"$@"'])
    return (
        "#!/bin/sh\n"
        "# Compiles this QPC on a QAIC host: sh compile.sh [extra compiler flags]\n"
        "# Written by spdflow. Paths are relative to this script, so the export folder can be\n"
        "# copied as a whole. QAIC_COMPILER overrides the compiler, SPDFLOW_ONNX the model.\n"
        "set -eu\n"
        'HERE="$(cd "$(dirname "$0")" && pwd)"\n'
        f'COMPILER="${{QAIC_COMPILER:-{_shell_word(str(SDK_ROOT / "exec" / qaic_config(request).compiler))}}}"\n'
        f'ONNX="${{SPDFLOW_ONNX:-$HERE/{_shell_word(onnx_rel)}}}"\n'
        "# The compiler writes qpc/ itself; a previous, possibly partial, one is removed first.\n"
        'rm -rf "$HERE/qpc"\n'
        f"{body}\n"
    )


def write_layout(plan: CompilePlan) -> None:
    """Write every file of the plan; remove a qpc/ left over from an unfinished compile."""
    plan.qpc_dir.mkdir(parents=True, exist_ok=True)
    for name, text in plan.files.items():
        write_text_atomic(plan.qpc_dir / name, text)
    write_text_atomic(plan.qpc_dir / "compile.sh", plan.script, mode=0o755)
    shutil.rmtree(plan.qpc_dir / "qpc", ignore_errors=True)


# ------------------------------------------------------------------------------ running


def run_compiler(plan: CompilePlan, progress=lambda message: None) -> None:
    """Run the command with its stdout and stderr streamed into compile.log (whose path is
    shown before the compiler starts, so a long compile can be followed with ``tail -f``);
    raise StageError on failure with the tail of what the compiler said."""
    log_path = plan.qpc_dir / "compile.log"
    progress(f"compiler output: {log_path} (follow with tail -f)")
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {shlex.join(plan.command)}\n")
        log.flush()
        start = log.tell()
        try:
            result = subprocess.run(
                plan.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            raise BackendUnavailableError(
                f"the QAIC compiler at {plan.compiler} could not be started ({exc.strerror}); "
                "check the Cloud AI SDK install or set QAIC_COMPILER"
            ) from None
    with open(log_path, "rb") as log:
        log.seek(start)
        stderr = log.read()[-65536:].decode("utf-8", errors="replace")
    if result.returncode != 0 or not plan.marker.is_file():
        shutil.rmtree(plan.qpc_dir / "qpc", ignore_errors=True)  # never leave a partial program
        raise StageError(_failure_message(plan, result.returncode, stderr, log_path))


def _failure_message(plan: CompilePlan, returncode: int, stderr: str, log_path: Path) -> str:
    tail = "\n".join(stderr.rstrip().splitlines()[-STDERR_TAIL_LINES:])
    if returncode == 0:
        what = f"{plan.compiler.name} exited 0 but wrote no qpc/{PROGRAM_MARKER}"
    else:
        what = f"{plan.compiler.name} failed with exit code {returncode}"
    return f"{what} compiling qpc-{plan.key}; full log: {log_path}" + (
        f"\n{tail}" if tail else ""
    )


def program_problem(qpc_dir: Path, *, verify: bool = False) -> str | None:
    """Why a compiled program cannot be reused, or None. Its done marker (written after a
    successful compile) must match its files; a program compiled elsewhere by compile.sh has no
    marker yet and is adopted: the marker is written now, so later damage is seen."""
    marker, why = cache.read_done(qpc_dir, verify=verify)
    if marker is not None:
        return None if f"qpc/{PROGRAM_MARKER}" in marker["files"] else f"qpc/{PROGRAM_MARKER} is not in its done marker"
    if (qpc_dir / cache.DONE_MARKER).exists():
        return why
    try:
        cache.write_done(qpc_dir)
    except OSError:
        pass  # a read-only program dir is used as it is
    return None


# ------------------------------------------------------------------------------ backend


class QaicBackend(Backend):
    """Qualcomm Cloud AI 100: qaic-compile for the program, qaicrt for sessions."""

    name = "qaic"
    version = "1"
    device_resource = "qaic"

    def unavailable_reason(self) -> str | None:
        from spdflow_qaic.runtime import runtime_unavailable_reason

        return runtime_unavailable_reason()

    def dtype_problem(self, dtype: str, config: Any) -> str | None:
        return dtype_problem(dtype, config if config is not None else QaicConfig())

    def compile(self, request: CompileRequest) -> CompiledProgram:
        """Write qpc-<hash>/ and compile into it, unless qpc/programqpc.bin is already there."""
        plan = plan_compile(request)
        with build_lock(plan.qpc_dir):  # runs sharing a cache compile each program once
            return self._compile(request, plan)

    def _compile(self, request: CompileRequest, plan: CompilePlan) -> CompiledProgram:
        if plan.marker.is_file() and not request.force:
            problem = program_problem(plan.qpc_dir, verify=request.verify)
            if problem is None:
                return self._program(request, plan, cached=True,
                                     reason=f"qpc-{plan.key}/qpc/{PROGRAM_MARKER} exists and matches its done marker")
            request.warn(f"program qpc-{plan.key} is not trusted ({problem}); rebuilding")
            shutil.rmtree(plan.qpc_dir / "qpc", ignore_errors=True)
        available = compiler_available(plan.compiler)
        if not available and not request.compile_only:
            raise BackendUnavailableError(
                f"the QAIC compiler was not found at {plan.compiler}; install the Cloud AI SDK, "
                "set QAIC_COMPILER, pass --compile-only to write a compile.sh for a QAIC host, "
                "or use devices.backend: onnxruntime"
            )
        write_layout(plan)
        if request.compile_only:
            return self._program(request, plan, cached=False, runnable=False,
                                 reason="compile-only: run compile.sh on a QAIC host")
        request.progress(f"compiling qpc-{plan.key} with {plan.compiler.name}")
        started = time.monotonic()
        run_compiler(plan, request.progress)
        cache.write_done(plan.qpc_dir, {"key": plan.key})
        why = "forced rebuild" if request.force else "no compiled program for this key"
        return self._program(request, plan, cached=False,
                             reason=f"{why}; compiled in {time.monotonic() - started:.1f} s")

    def describe_compile(self, request: CompileRequest, *, exported: bool) -> list[str]:
        """The program dir, the exact qaic-compile argv and the compile.sh that repeats it."""
        plan = plan_compile(request)
        qpc_dir = str(plan.qpc_dir) if exported else str(Path(request.export_dir) / "qpc-<hash of the export>")
        command = [arg.replace(str(plan.qpc_dir), qpc_dir) for arg in plan.command]
        return [f"program dir: {qpc_dir}", f"compile command: {shlex.join(command)}",
                f"compile.sh: {qpc_dir}/compile.sh (the same command, paths relative to it)"]

    @staticmethod
    def _program(request: CompileRequest, plan: CompilePlan, *, cached: bool, reason: str,
                 runnable: bool = True) -> CompiledProgram:
        part = qaic_config(request).programs
        if part != "both":  # a disaggregated-serving program: spdflow's loop needs both halves
            runnable = False
            reason += f"; {part} shapes only, for a disaggregated server (spdflow does not generate with it)"
        return CompiledProgram(
            backend="qaic",
            qpc_dir=plan.qpc_dir,
            key=plan.key,
            cached=cached,
            reason=reason,
            specializations=program_shapes(request),
            model_info=request.model_info,
            command=plan.command,
            runnable=runnable,
        )

    def open_session(self, program: CompiledProgram, *, threads: int | None = None) -> Session:
        """A qaicrt session on the devices the program was compiled for (threads is unused)."""
        from spdflow_qaic.runtime import QaicSession

        marker = Path(program.qpc_dir) / "qpc" / PROGRAM_MARKER
        if not program.runnable or not marker.is_file():
            raise StageError(
                f"{program.qpc_dir} holds no compiled program ({PROGRAM_MARKER} is missing); "
                "run its compile.sh on a QAIC host, then run again"
            )
        return QaicSession(
            marker.parent,
            device_ids=_compiled_device_ids(Path(program.qpc_dir)),
            specializations=program.specializations,
            vocab_size=program.model_info.vocab_size,
        )


def _compiled_device_ids(qpc_dir: Path) -> list[int] | None:
    # The backend is built without arguments, so the device group comes from qconfig.json.
    try:
        config = json.loads((qpc_dir / "qconfig.json").read_text(encoding="utf-8"))
        return [int(d) for d in config["devices"]["device_ids"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
