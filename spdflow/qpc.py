"""The compiled-program directory ``qpc-<hash>/`` that every backend writes (DESIGN §4).

Layout, shared by the qaic and onnxruntime backends::

    <export dir>/qpc-<first 16 hex of sha256(canonical JSON of the compile params)>/
        specializations.json      flat (every value a string) or named format
        custom_io.yaml            Precision of every past_* IO
        mdp_ts_<N>.json           only for more than one device
        hashed_compile_params.json
        qconfig.json
        qpc/                      the program; qpc/programqpc.bin marks a finished QAIC compile

This module only builds documents and writes files; it imports nothing heavy. Formats follow
QEfficient 1.22 (research/qefficient.md §2.2) byte for byte where a compiler reads them.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

from spdflow.api import ModelInfo, Specialization

#: The file whose presence marks a finished QAIC compile (inside ``qpc/``).
PROGRAM_MARKER = "programqpc.bin"

#: Precision of the KV cache IOs by model dtype: the compiler has no float32 KV cache.
KV_PRECISION = {"float32": "float16", "float16": "float16", "bfloat16": "bfloat16"}

SPECIALIZATION_FORMATS = ("flat", "named")


# -------------------------------------------------------------------------------------- hashing


def canonical_json(obj: Any) -> str:
    """The one JSON text of ``obj`` that hashes are taken over (sorted keys, no spaces, no NaN)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def short_hash(obj: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``canonical_json(obj)`` (QEfficient's rule)."""
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------------------- specializations


def _string_symbols(spec: Specialization) -> dict[str, str]:
    # Integers make qaic-compile exit 255, so every value is written as a string.
    return {name: str(value) for name, value in spec.symbols().items()}


def _graph_names(specs: Sequence[Specialization]) -> list[str]:
    """Names of the named format: "Prefill", then "Decode_0", "Decode_1", ... in order.

    QEfficient suffixes a name only when it repeats; we always number decode graphs so a
    name does not change meaning when the K-list grows.
    """
    names, decode_index = [], 0
    for spec in specs:
        if spec.kind == "prefill":
            names.append("Prefill")
        else:
            names.append(f"Decode_{decode_index}")
            decode_index += 1
    if names.count("Prefill") > 1:
        # Several prefill shapes would clash; number them like the decode graphs.
        counter = iter(range(len(names)))
        names = [f"Prefill_{next(counter)}" if n == "Prefill" else n for n in names]
    return names


def specializations_document(specs: Sequence[Specialization], fmt: str = "flat") -> dict:
    """The content of specializations.json for ``specs``, in order.

    ``flat`` (default): ``{"specializations": [{symbol: "value", ...}, ...]}``, the format the
    SDK documents and the only one 4-device MDP programs load. ``named``:
    ``{"specializations": [{"name": "Prefill", "symbols": {...}}, ...]}``. Values are always
    strings and no internal tag such as ``_graph_name`` is ever written.
    """
    if fmt == "flat":
        return {"specializations": [_string_symbols(spec) for spec in specs]}
    if fmt == "named":
        names = _graph_names(specs)
        return {
            "specializations": [
                {"name": name, "symbols": _string_symbols(spec)} for name, spec in zip(names, specs)
            ]
        }
    raise ValueError(
        f"unknown specializations format {fmt!r}; use one of {', '.join(SPECIALIZATION_FORMATS)}"
    )


# ----------------------------------------------------------------------------------- custom IO


def kv_precision(dtype: str, mxint8_kv: bool) -> str:
    """The Precision of the KV cache IOs for a model of ``dtype`` (float32|float16|bfloat16)."""
    if mxint8_kv:
        return "mxint8"
    try:
        return KV_PRECISION[dtype]
    except KeyError:
        raise ValueError(
            f"unknown model dtype {dtype!r}; use one of {', '.join(KV_PRECISION)}"
        ) from None


def custom_io_entries(model_info: ModelInfo, dtype: str, mxint8_kv: bool) -> list[tuple[str, str]]:
    """(IO name, Precision) for every KV cache input and its _RetainedState output, per layer.

    Order follows QEfficient: for each layer, past_key.i, past_value.i, then both retained
    states. mxint8 KV is not a compiler flag; it is only this Precision.
    """
    precision = kv_precision(dtype, mxint8_kv)
    entries: list[tuple[str, str]] = []
    for layer in range(model_info.num_layers):
        for suffix in ("", "_RetainedState"):
            for kind in ("past_key", "past_value"):
                entries.append((f"{kind}.{layer}{suffix}", precision))
    return entries


def render_custom_io(entries: Sequence[tuple[str, str]]) -> str:
    """custom_io.yaml text: `` - IOName: <name>`` / ``   Precision: <dtype>`` and a blank line."""
    return "".join(f" - IOName: {name}\n   Precision: {precision}\n\n" for name, precision in entries)


# ------------------------------------------------------------------------------ multi-device


def mdp_config(device_ids: Sequence[int], num_cores: int) -> dict:
    """The tensor-slicing partition config (mdp_ts_<N>.json) for a device group.

    Connections use group-relative ids 0..N-1 (as QEfficient writes them); partitions name each
    device by its position in the group, since the runtime maps positions to physical ids.
    """
    positions = list(range(len(device_ids)))
    return {
        "connections": [{"devices": positions, "type": "p2p"}],
        "partitions": [
            {
                "name": "Partition0",
                "devices": [{"deviceId": d, "numCores": num_cores} for d in positions],
            }
        ],
    }


def mdp_file_name(num_devices: int) -> str:
    """``mdp_ts_<N>.json``: the name QEfficient gives the partition config of N devices."""
    return f"mdp_ts_{num_devices}.json"


# ---------------------------------------------------------------------------- atomic writes


def write_text_atomic(path: Path | str, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` via a temp file in the same dir, so readers never see half of it.

    ``mode`` is applied before the rename (temp files are created 0600), e.g. 0o755 for scripts.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON (as QEfficient's create_json does), atomically."""
    write_text_atomic(path, json.dumps(obj, indent=4, sort_keys=True, allow_nan=False) + "\n")


@contextlib.contextmanager
def atomic_dir(target: Path | str) -> Iterator[Path]:
    """Yield a fresh temp dir next to ``target``; on success it becomes ``target``.

    An existing ``target`` is replaced: callers only enter this when the target is missing or
    incomplete. On any exception the temp dir is deleted and the exception propagates, so a
    half-built directory is never found under the target name.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    os.chmod(work, 0o755)  # mkdtemp makes 0700; the result is a shared cache entry
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(work, target)
