"""QAIC file formats of the ``qpc-<hash>/`` directory (DESIGN §4).

Layout::

    <export dir>/qpc-<first 16 hex of sha256(canonical JSON of the compile params)>/
        specializations.json      flat (every value a string) or named format
        custom_io.yaml            Precision of every past_* IO
        mdp_ts_<N>.json           only for more than one device
        hashed_compile_params.json
        qconfig.json
        qpc/                      the program; qpc/programqpc.bin marks a finished QAIC compile

Documents only; nothing here writes files or imports anything heavy. Formats follow QEfficient
1.22 (research/qefficient.md §2.2) byte for byte where a compiler reads them. The onnxruntime
backend writes the same specializations.json and custom_io.yaml, so its program directory
reads like a QAIC one.
"""
from __future__ import annotations

from typing import Sequence

from spdflow.api import ModelInfo, Specialization

#: The file whose presence marks a finished QAIC compile (inside ``qpc/``).
PROGRAM_MARKER = "programqpc.bin"

#: Precision of the KV cache IOs by model dtype: the compiler has no float32 KV cache.
KV_PRECISION = {"float32": "float16", "float16": "float16", "bfloat16": "bfloat16"}

SPECIALIZATION_FORMATS = ("flat", "named")


# ---------------------------------------------------------------------------- specializations


def _string_symbols(spec: Specialization) -> dict[str, str]:
    # Integers make qaic-compile exit 255, so every value is written as a string.
    symbols = {name: str(value) for name, value in spec.symbols().items()}
    if spec.kind == "prefill" and spec.full_batch_size is not None:
        # QEfficient's CB prefill names its execution batch (the ONNX has no such axis).
        symbols["full_batch_exec_size"] = str(spec.batch_size)
    return symbols


def _graph_names(specs: Sequence[Specialization]) -> list[str]:
    """Names of the named format, as QEfficient gives them: "Prefill" and "Decode", numbered
    ``_0``, ``_1`` ... in order only where a name repeats (several decode shapes)."""
    names = ["Prefill" if spec.kind == "prefill" else "Decode" for spec in specs]
    for base in ("Prefill", "Decode"):
        if names.count(base) > 1:
            counter = iter(range(len(names)))
            names = [f"{base}_{next(counter)}" if name == base else name for name in names]
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

    Order follows QEfficient: for each layer past_key.i, past_key.i_RetainedState, past_value.i,
    past_value.i_RetainedState. mxint8 KV is not a compiler flag; it is only this Precision.
    """
    precision = kv_precision(dtype, mxint8_kv)
    entries: list[tuple[str, str]] = []
    for layer in range(model_info.num_layers):
        for kind in ("past_key", "past_value"):
            for suffix in ("", "_RetainedState"):
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
