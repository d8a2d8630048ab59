"""Contract tests of the qaic backend (DESIGN §4) with a recording fake qaic-compile."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from spdflow.api import CompileRequest, ModelInfo
from spdflow.errors import BackendUnavailableError, StageError
from spdflow.recipe.schema import DevicesSpec
from spdflow_qaic import formats
from spdflow_qaic.config import QaicConfig
from spdflow_qaic import QaicBackend, spdflow_register_backends
from spdflow_qaic import runtime as qaic_runtime
from spdflow_shapes import specialize

FAKE_COMPILER = Path(__file__).with_name("fake_qaic_compile")
MODEL = ModelInfo(
    name="tiny", model_type="llama", vocab_size=11, num_layers=2, num_kv_heads=1, head_dim=4,
    eos_token_ids=(2,), pad_token_id=0, source_dir=Path("/nowhere"), tokenizer_file=None,
)


@pytest.fixture
def record(tmp_path, monkeypatch):
    """Point QAIC_COMPILER at the fake; returns a function reading the argv it was called with."""
    path = tmp_path / "record.jsonl"
    monkeypatch.setenv("QAIC_COMPILER", str(FAKE_COMPILER))
    monkeypatch.setenv("FAKE_QAIC_RECORD", str(path))
    monkeypatch.delenv("FAKE_QAIC_EXIT", raising=False)
    return lambda: [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def onnx(tmp_path):
    """A dummy ONNX inside an export dir: the fake compiler never reads it."""
    path = tmp_path / "export-0123" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(b"not really onnx")
    return path


def make_request(onnx, ks=(0, 4), fbs=None, *, fmt="flat", dtype="float32", compile_only=False,
                 force=False, **devices) -> CompileRequest:
    return CompileRequest(
        onnx_path=onnx,
        export_dir=onnx.parent,
        specializations=specialize(list(ks), 32, 128, 1, fbs),
        num_speculative_tokens=list(ks),
        devices=DevicesSpec(backend="qaic", **{k: devices.pop(k) for k in list(devices) if k == "device_ids"}),
        backend_config=QaicConfig(specializations_format=fmt, **devices),
        model_info=MODEL,
        role="target",
        continuous_batching=fbs is not None,
        compile_only=compile_only,
        force=force,
        dtype=dtype,
    )


def read_json(path: Path):
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------- the command


def test_compile_runs_the_contract_command_and_writes_the_layout(record, onnx):
    program = QaicBackend().compile(make_request(onnx))
    d = program.qpc_dir
    assert d.parent == onnx.parent and d.name == f"qpc-{program.key}" and len(program.key) == 16
    assert program.command == [
        str(FAKE_COMPILER), "-aic-hw", "-aic-hw-version=ai100", f"-m={onnx}", "-retained-state",
        "-convert-to-fp16", "-aic-num-cores=16", f"-network-specialization-config={d}/specializations.json",
        f"-custom-IO-list-file={d}/custom_io.yaml", f"-aic-binary-dir={d}/qpc",
    ]
    assert record() == [program.command]
    assert program.runnable and not program.cached and program.backend == "qaic"
    for name in ["specializations.json", "custom_io.yaml", "hashed_compile_params.json", "qconfig.json",
                 "compile.sh", "compile.log", "qpc/programqpc.bin"]:
        assert (d / name).is_file(), name
    assert not list(d.glob("mdp_ts_*.json"))
    # what the compiler was given is what the directory holds
    assert (d / "qpc" / "specializations.json").read_text() == (d / "specializations.json").read_text()
    assert "fake qaic-compile: done" in (d / "compile.log").read_text()


def test_compile_options_become_flags_in_order(record, onnx):
    request = make_request(
        onnx, aic_hw_version="ai200", num_cores=14, mxfp6_matmul=True,
        compiler_options={"mos": 1, "aic_enable_depth_first": True, "ols": False, "multicast-weights": True},
    )
    argv = QaicBackend().compile(request).command
    assert argv[1:5] == ["-aic-hw", "-aic-hw-version=ai200", f"-m={onnx}", "-retained-state"]
    options = argv[5:-3]
    assert options[:3] == ["-convert-to-fp16", "-mxfp6-matmul", "-aic-num-cores=14"]
    assert set(options[3:]) == {"-mos=1", "-aic-enable-depth-first", "-multicast-weights"}
    assert not any(a.startswith("-ols") for a in argv)
    assert [a.split("=")[0] for a in argv[-3:]] == [
        "-network-specialization-config", "-custom-IO-list-file", "-aic-binary-dir"]


def test_compile_rejects_compiler_options_spdflow_derives(record, onnx):
    with pytest.raises(StageError, match="'aic_num_cores', which spdflow derives itself"):
        QaicBackend().compile(make_request(onnx, compiler_options={"aic_num_cores": 4}))


def test_legacy_qaic_exec_adds_compile_only_after_the_model(record, onnx):
    argv = QaicBackend().compile(make_request(onnx, compiler="qaic-exec")).command
    assert argv[3:5] == [f"-m={onnx}", "-compile-only"]
    assert record() == [argv]


# ---------------------------------------------------------------------------- specializations


def flat_shape(batch, seq, nlk, fbs=None, prefill=False):
    doc = {"batch_size": str(batch), "seq_len": str(seq), "ctx_len": "128", "num_logits_to_keep": str(nlk)}
    if fbs is not None:
        doc["full_batch_size"] = str(fbs)
        if prefill:  # QEfficient's CB prefill also names its execution batch
            doc["full_batch_exec_size"] = str(batch)
    return doc


@pytest.mark.parametrize("fbs", [None, 4])
@pytest.mark.parametrize(
    "ks, seq_lens", [(3, [4]), ([0, 4], [1, 5]), ([4, 0, 4], [1, 5]), ([1, 2, 4, 7], [2, 3, 5, 8])]
)
def test_specializations_json_is_flat_with_string_values(record, onnx, ks, seq_lens, fbs):
    ks = [ks] if isinstance(ks, int) else ks
    program = QaicBackend().compile(make_request(onnx, ks, fbs))
    expected = [flat_shape(1, 32, 1, fbs, prefill=True)] + [flat_shape(fbs or 1, n, n, fbs) for n in seq_lens]
    assert read_json(program.qpc_dir / "specializations.json") == {"specializations": expected}
    assert read_json(program.qpc_dir / "qconfig.json")["num_speculative_tokens"] == sorted(set(ks))


def test_specializations_json_named_format(record, onnx):
    program = QaicBackend().compile(make_request(onnx, [0, 4], fmt="named"))
    assert read_json(program.qpc_dir / "specializations.json") == {"specializations": [
        {"name": "Prefill", "symbols": flat_shape(1, 32, 1)},
        {"name": "Decode_0", "symbols": flat_shape(1, 1, 1)},
        {"name": "Decode_1", "symbols": flat_shape(1, 5, 5)},
    ]}


def test_k_list_order_does_not_change_the_program(record, onnx):
    a = QaicBackend().compile(make_request(onnx, [4, 0]))
    b = QaicBackend().compile(make_request(onnx, [0, 4]))
    assert a.qpc_dir == b.qpc_dir and b.cached


# ---------------------------------------------------------------------------------- custom IO


def custom_io_text(precision):
    names = [f"{kind}.{layer}{suffix}" for layer in range(2) for kind in ("past_key", "past_value")
             for suffix in ("", "_RetainedState")]
    return "".join(f" - IOName: {name}\n   Precision: {precision}\n\n" for name in names)


@pytest.mark.parametrize(
    "dtype, mxint8, precision, fp16_flag",
    [("float32", False, "float16", True), ("float16", False, "float16", True),
     ("bfloat16", False, "bfloat16", False), ("float32", True, "mxint8", True)],
)
def test_custom_io_precision_follows_dtype_and_mxint8(record, onnx, dtype, mxint8, precision, fp16_flag):
    hw = "ai200" if dtype == "bfloat16" else "ai100"  # the AI 100 compiler refuses bf16 (below)
    program = QaicBackend().compile(make_request(onnx, dtype=dtype, mxint8_kv_cache=mxint8, aic_hw_version=hw))
    assert (program.qpc_dir / "custom_io.yaml").read_text() == custom_io_text(precision)
    assert ("-convert-to-fp16" in program.command) == fp16_flag
    assert not any("mxint8" in arg for arg in program.command)  # mxint8 KV is not a flag


def test_bfloat16_for_ai100_is_refused_before_anything_is_written(record, onnx):
    with pytest.raises(StageError, match="AI 100 compiler does not take bfloat16.*model.dtype: float32"):
        QaicBackend().compile(make_request(onnx, dtype="bfloat16", compile_only=True))
    assert [p.name for p in onnx.parent.iterdir()] == ["model.onnx"] and record() == []


# ------------------------------------------------------------------------------- multi-device


def test_four_devices_write_the_mdp_partition_config(record, onnx):
    program = QaicBackend().compile(make_request(onnx, device_ids=[4, 5, 6, 7], num_cores=16))
    path = program.qpc_dir / "mdp_ts_4.json"
    assert read_json(path) == {
        "connections": [{"devices": [0, 1, 2, 3], "type": "p2p"}],
        "partitions": [{"name": "Partition0", "devices": [
            {"deviceId": d, "numCores": 16} for d in range(4)]}],
    }
    assert program.command[4] == f"-mdp-load-partition-config={path}"  # right after -m=
    assert "-aic-num-cores=16" in program.command
    assert (program.qpc_dir / "qpc" / "mdp_ts_4.json").is_file()
    single = QaicBackend().compile(make_request(onnx))
    assert single.key != program.key


# ------------------------------------------------------------------------------------- cache


def test_second_compile_is_a_cache_hit_without_running_the_compiler(record, onnx):
    first = QaicBackend().compile(make_request(onnx))
    second = QaicBackend().compile(make_request(onnx))
    assert second.cached and second.qpc_dir == first.qpc_dir and "programqpc.bin exists" in second.reason
    assert "matches its done marker" in second.reason
    assert len(record()) == 1


def test_missing_programqpc_bin_rebuilds(record, onnx):
    first = QaicBackend().compile(make_request(onnx))
    (first.qpc_dir / "qpc" / "programqpc.bin").unlink()
    (first.qpc_dir / "qpc" / "partial.bin").write_bytes(b"junk")
    again = QaicBackend().compile(make_request(onnx))
    assert not again.cached and len(record()) == 2
    assert not (again.qpc_dir / "qpc" / "partial.bin").exists()


def test_a_damaged_program_is_a_warning_and_a_recompile(record, onnx):
    warnings = []
    first = QaicBackend().compile(make_request(onnx))
    program = first.qpc_dir / "qpc" / "programqpc.bin"
    program.write_bytes(b"\0" * (program.stat().st_size + 1))  # damaged after it was written
    again = QaicBackend().compile(dataclasses.replace(make_request(onnx), warn=warnings.append))
    assert not again.cached and len(record()) == 2
    assert warnings and "'qpc/programqpc.bin' changed size" in warnings[0]
    assert QaicBackend().compile(make_request(onnx)).cached  # the new program is trusted again


def test_a_program_compiled_elsewhere_by_compile_sh_is_adopted(record, onnx):
    from spdflow.engine import cache

    first = QaicBackend().compile(make_request(onnx))
    (first.qpc_dir / cache.DONE_MARKER).unlink()  # as compile.sh on a QAIC host leaves it
    assert QaicBackend().compile(make_request(onnx)).cached and len(record()) == 1
    assert cache.read_done(first.qpc_dir)[0] is not None


def test_force_rebuilds_a_finished_program(record, onnx):
    QaicBackend().compile(make_request(onnx))
    again = QaicBackend().compile(make_request(onnx, force=True))
    assert not again.cached and "forced" in again.reason and len(record()) == 2


def test_different_onnx_content_gets_a_different_key(record, onnx):
    first = QaicBackend().compile(make_request(onnx))
    onnx.write_bytes(b"another graph")
    assert QaicBackend().compile(make_request(onnx)).key != first.key


# ----------------------------------------------------------------------------------- failure


def test_compiler_failure_quotes_exit_code_stderr_and_log(record, onnx, monkeypatch):
    monkeypatch.setenv("FAKE_QAIC_EXIT", "255")
    with pytest.raises(StageError) as info:
        QaicBackend().compile(make_request(onnx))
    message = info.value.message
    qpc_dir = next(onnx.parent.glob("qpc-*"))
    assert "exit code 255" in message
    assert "Error: fake qaic-compile failure (exit 255)" in message
    assert str(qpc_dir / "compile.log") in message
    assert "fake qaic-compile failure" in (qpc_dir / "compile.log").read_text()
    assert not (qpc_dir / "qpc").exists()


def test_missing_compiler_without_compile_only_is_unavailable(record, onnx, monkeypatch, tmp_path):
    monkeypatch.setenv("QAIC_COMPILER", str(tmp_path / "no-such-compiler"))
    with pytest.raises(BackendUnavailableError) as info:
        QaicBackend().compile(make_request(onnx))
    message = info.value.message
    assert f"the QAIC compiler was not found at {tmp_path / 'no-such-compiler'}" in message
    assert "--compile-only" in message and "onnxruntime" in message
    assert "\n" not in message


# ------------------------------------------------------------------------------ compile-only


def test_compile_only_without_a_compiler_writes_a_runnable_compile_sh(record, onnx, monkeypatch, tmp_path):
    monkeypatch.setenv("QAIC_COMPILER", str(tmp_path / "no-such-compiler"))
    program = QaicBackend().compile(make_request(onnx, compile_only=True, device_ids=[0, 1]))
    assert not program.runnable and program.reason == "compile-only: run compile.sh on a QAIC host"
    script = program.qpc_dir / "compile.sh"
    assert os.access(script, os.X_OK) and not (program.qpc_dir / "qpc").exists()
    assert record() == []

    # Copy the export folder elsewhere, as to a QAIC host, and compile there with one command.
    host = tmp_path / "host" / "export"
    shutil.copytree(onnx.parent, host)
    host_qpc = host / program.qpc_dir.name
    env = {**os.environ, "QAIC_COMPILER": str(FAKE_COMPILER)}
    subprocess.run([str(host_qpc / "compile.sh")], check=True, env=env, capture_output=True, cwd=tmp_path)
    assert (host_qpc / "qpc" / "programqpc.bin").is_file()
    [argv] = record()
    here = str(host_qpc.resolve())
    expected = [a.replace(str(program.qpc_dir), here) for a in program.command]
    expected[0], expected[3] = str(FAKE_COMPILER), f"-m={here}/../model.onnx"
    assert argv == expected
    # The copied program is now a cache hit where it lives.
    request = make_request(host / "model.onnx", compile_only=True, device_ids=[0, 1])
    assert QaicBackend().compile(request).cached


def test_compile_only_with_a_compiler_writes_files_but_does_not_run_it(record, onnx):
    program = QaicBackend().compile(make_request(onnx, compile_only=True))
    assert not program.runnable and record() == []
    assert (program.qpc_dir / "compile.sh").is_file() and (program.qpc_dir / "specializations.json").is_file()
    # A later real compile of the same recipe lands in the same directory.
    assert QaicBackend().compile(make_request(onnx)).qpc_dir == program.qpc_dir


def test_open_session_refuses_a_compile_only_program(record, onnx):
    program = QaicBackend().compile(make_request(onnx, compile_only=True))
    with pytest.raises(StageError, match="run its compile.sh on a QAIC host"):
        QaicBackend().open_session(program)


# ------------------------------------------------------------------------------------ runtime


@pytest.fixture
def no_sdk(monkeypatch):
    monkeypatch.setitem(sys.modules, "qaicrt", None)  # None in sys.modules makes import fail
    monkeypatch.setitem(sys.modules, "QAicApi_pb2", None)
    monkeypatch.setattr(qaic_runtime, "SDK_PYTHON_DIRS", ())


def test_unavailable_runtime_is_one_sentence(no_sdk):
    reason = QaicBackend().unavailable_reason()
    assert reason.startswith("the QAIC runtime (qaicrt")
    assert "--compile-only" in reason and "onnxruntime" in reason and "\n" not in reason


def test_open_session_without_the_sdk_raises_backend_unavailable(record, onnx, no_sdk):
    program = QaicBackend().compile(make_request(onnx))
    with pytest.raises(BackendUnavailableError, match="not installed here"):
        QaicBackend().open_session(program)


def test_registers_the_qaic_backend():
    calls = []
    spdflow_register_backends(register=lambda name, factory, **kw: calls.append((name, factory, kw)))
    assert [(name, factory) for name, factory, _ in calls] == [("qaic", QaicBackend)]
    assert calls[0][2]["description"]


# --------------------------------------------------------------------- session over a fake qaicrt


class FakeRuntime:
    """Just enough of qaicrt and QAicApi_pb2 to check what the session hands the runtime."""

    def __init__(self, vocab, bindings):
        ok = "ok"
        self.runs = []
        self.created = {}
        runtime = self

        class QBuffer:
            def __init__(self, data):
                self.data, self.size = bytes(data), len(data)

            def __bytes__(self):
                return self.data

        class ExecObj:
            def __init__(self, context, program):
                self.dims = None

            def setData(self, buffers, dims):
                self.dims = [(b.size, list(d[1])) for b, d in zip(buffers, dims)]
                return ok

            def waitForCompletion(self):
                return ok

            def getData(self):
                runtime.runs.append(self.dims)
                logits_shape = self.dims[-1][1]
                data = np.arange(np.prod(logits_shape), dtype=np.float32).tobytes()
                return ok, [QBuffer(b"") for _ in bindings[:-1]] + [QBuffer(data)]

        class Qpc:
            def __init__(self, path):
                runtime.created["qpc"] = path

            def getIoDescriptor(self):
                return ok, b""

        class IoDesc:
            def ParseFromString(self, data):
                self.selected_set = types.SimpleNamespace(bindings=bindings)
                self.allowed_shapes = []

        class Program:
            def __init__(self, context, device, qpc, properties):
                runtime.created["program"] = (device, getattr(properties, "devMapping", None))

            def load(self):
                return ok

            def activate(self):
                return ok

            def deactivate(self):
                runtime.created["closed"] = True

        self.qaicrt = types.SimpleNamespace(
            QStatus=types.SimpleNamespace(QS_SUCCESS=ok), QBuffer=QBuffer, ExecObj=ExecObj, Qpc=Qpc,
            Program=Program, Context=lambda *a: "ctx", QIDList=list, Queue=lambda *a: types.SimpleNamespace(
                enqueue=lambda e: ok), QAicProgramProperties=types.SimpleNamespace,
            BufferDimensionsVecRef=list,
        )
        self.aicapi = types.SimpleNamespace(IoDesc=IoDesc, FLOAT_TYPE=1, INT64_I_TYPE=7, FLOAT_16_TYPE=6,
                                            BUFFER_IO_TYPE_INPUT=0, BUFFER_IO_TYPE_OUTPUT=1)


def binding(index, name, direction, dtype, dims):
    return types.SimpleNamespace(index=index, name=name, dir=direction, type=dtype, dims=dims,
                                 size=int(np.prod(dims)) * (8 if dtype == 7 else 4))


def test_session_sizes_logits_per_k_and_keeps_the_kv_on_device(record, onnx, monkeypatch):
    names = [("input_ids", 0, 7, [1, 32]), ("position_ids", 0, 7, [1, 32]),
             ("past_key.0", 0, 6, [1, 1, 128, 4]), ("past_value.0", 0, 6, [1, 1, 128, 4]),
             ("num_logits_to_keep", 0, 7, [1, 1]), ("past_key.0_RetainedState", 1, 6, [1, 1, 128, 4]),
             ("past_value.0_RetainedState", 1, 6, [1, 1, 128, 4]), ("logits", 1, 1, [1, 1, 11])]
    fake = FakeRuntime(11, [binding(i, *row) for i, row in enumerate(names)])
    monkeypatch.setattr(qaic_runtime, "load_runtime", lambda: (fake.qaicrt, fake.aicapi))
    program = QaicBackend().compile(make_request(onnx, [0, 4], device_ids=[2]))
    session = QaicBackend().open_session(program)
    assert (session.kv_batch_size, session.ctx_len, session.vocab_size) == (1, 128, 11)
    assert fake.created["program"] == (2, None)

    ids = np.zeros((1, 5), dtype=np.int64)
    logits = session.run(ids, np.arange(5)[None], num_logits_to_keep=5)
    assert logits.shape == (1, 5, 11) and logits.dtype == np.float32
    dims = dict(zip([n for n, *_ in names], fake.runs[-1]))
    assert dims["input_ids"][1] == [1, 5] and dims["num_logits_to_keep"][1] == [5, 1]
    assert dims["logits"] == (1 * 5 * 11 * 4, [1, 5, 11])
    assert all(dims[n][0] == 0 for n in dims if n.startswith("past_"))  # skipped: KV stays on device
    session.close()
    assert fake.created["closed"]


# ------------------------------------------------------------------------------ formats


def test_specializations_document_never_writes_integers_or_internal_tags():
    specs = specialize([0, 4], 32, 128, 1, 4)
    for fmt in ("flat", "named"):
        text = json.dumps(formats.specializations_document(specs, fmt))
        assert "_graph_name" not in text and '": 1' not in text and "kind" not in text
    with pytest.raises(ValueError, match="unknown specializations format 'yaml'"):
        formats.specializations_document(specs, "yaml")


def test_render_custom_io_exact_format():
    assert formats.render_custom_io([("past_key.0", "mxint8")]) == " - IOName: past_key.0\n   Precision: mxint8\n\n"


# ------------------------------------------------------------------------------ compile knobs


@pytest.mark.parametrize("part, kinds", [("prefill", ["prefill"]), ("decode", ["decode", "decode"])])
def test_prefill_or_decode_only_programs_hold_only_those_shapes(record, onnx, part, kinds):
    both = QaicBackend().compile(make_request(onnx))
    program = QaicBackend().compile(make_request(onnx, programs=part))
    assert [s.kind for s in program.specializations] == kinds and program.key != both.key
    assert len(read_json(program.qpc_dir / "specializations.json")["specializations"]) == len(kinds)
    assert not program.runnable and "disaggregated" in program.reason


def test_sub_functions_flag_follows_the_options_in_command_script_and_key(record, onnx):
    plain = QaicBackend().compile(make_request(onnx, compiler_options={"mos": 1}))
    program = QaicBackend().compile(make_request(onnx, compiler_options={"mos": 1}, sub_functions=True))
    assert program.command[-4:-3] == ["-sub-functions"] and program.command[-5] == "-mos=1"
    assert "-sub-functions" in (program.qpc_dir / "compile.sh").read_text() and program.key != plain.key


def test_user_mdp_partition_file_is_copied_and_passed_after_m(record, onnx, tmp_path):
    user = tmp_path / "my_partition.json"
    user.write_text('{"connections": [], "partitions": [{"name": "P", "devices": [{"deviceId": 0, "numCores": 8}]}]}')
    program = QaicBackend().compile(make_request(onnx, mdp_partition_file=str(user)))
    assert program.command[4] == f"-mdp-load-partition-config={program.qpc_dir}/my_partition.json"
    assert (program.qpc_dir / "my_partition.json").read_text() == user.read_text()
    assert '"-mdp-load-partition-config=$HERE/my_partition.json"' in (program.qpc_dir / "compile.sh").read_text()
    user.write_text(user.read_text().replace("8", "4"))
    assert QaicBackend().compile(make_request(onnx, mdp_partition_file=str(user))).key != program.key
    with pytest.raises(StageError, match="mdp_partition_file .* cannot be used"):
        QaicBackend().compile(make_request(onnx, mdp_partition_file=str(tmp_path / "missing.json")))


def test_aic_hw_version_auto_asks_qaic_util_and_falls_back_to_ai100(record, onnx, tmp_path, monkeypatch):
    from spdflow_qaic import backend

    util = tmp_path / "qaic-util"
    util.write_text("#!/bin/sh\necho 'QID 0'\necho '\tFW IMAGE_VARIANT:AIC200_01'\n")
    util.chmod(0o755)
    backend.detect_hw_version.cache_clear()
    monkeypatch.setenv("QAIC_UTIL", str(util))
    assert "-aic-hw-version=ai200" in QaicBackend().compile(make_request(onnx)).command
    assert "-aic-hw-version=ai100" in QaicBackend().compile(make_request(onnx, aic_hw_version="ai100")).command
    monkeypatch.setenv("QAIC_UTIL", str(tmp_path / "absent"))
    assert "-aic-hw-version=ai100" in QaicBackend().compile(make_request(onnx)).command
    backend.detect_hw_version.cache_clear()


def test_compile_log_path_is_shown_before_the_compiler_runs(record, onnx):
    import dataclasses

    seen = []

    def progress(message):
        seen.append((message, any(onnx.parent.glob("qpc-*/qpc/programqpc.bin"))))

    QaicBackend().compile(dataclasses.replace(make_request(onnx), progress=progress))
    log_lines = [(m, done) for m, done in seen if "compile.log" in m]
    assert log_lines and not log_lines[0][1], "the log path is announced before the program exists"
    qpc_dir = next(onnx.parent.glob("qpc-*"))
    assert str(qpc_dir / "compile.log") in log_lines[0][0]


# ------------------------------------------------------------------ compute context lengths (CCL)


def make_ccl_request(onnx, ks=(0, 4), fbs=None, ccl=(32, 64), **config) -> CompileRequest:
    request = make_request(onnx, ks, fbs, **config)
    request.specializations = specialize(list(ks), 32, 128, 1, fbs, comp_ctx_lengths=list(ccl))
    request.backend_config = request.backend_config.model_copy(update={"comp_ctx_lengths": list(ccl)})
    return request


def ccl_shape(batch, seq, nlk, ccl, fbs=None, prefill=False):
    doc = flat_shape(batch, seq, nlk, fbs, prefill)
    # QEfficient's place for the symbol: after ctx_len
    return {k: v for k, v in [*list(doc.items())[:3], ("comp_ctx_lengths", str(ccl)), *list(doc.items())[3:]]}


@pytest.mark.parametrize("fbs", [None, 4])
def test_ccl_specializations_cross_every_decode_k_with_every_ccl(record, onnx, fbs):
    """QEfficient 1.22 refuses CCL with a K-list for a TLM; spdflow writes prefill × prefill CCLs,
    then each K × each decode CCL, and the compile command is the same as without CCL."""
    program = QaicBackend().compile(make_ccl_request(onnx, [0, 4], fbs))
    d = program.qpc_dir
    expected = [ccl_shape(1, 32, 1, c, fbs, prefill=True) for c in (32, 64, 128)]
    expected += [ccl_shape(fbs or 1, n, n, c, fbs) for n in (1, 5) for c in (32, 64, 128)]
    assert read_json(d / "specializations.json") == {"specializations": expected}
    assert list(expected[3]) == ["batch_size", "seq_len", "ctx_len", "comp_ctx_lengths", "num_logits_to_keep",
                                 *(["full_batch_size"] if fbs else [])]
    plain = QaicBackend().compile(make_request(onnx, [0, 4], fbs))
    assert plain.qpc_dir != d  # the CCLs are in the key
    assert [a.replace(str(d), "D") for a in program.command] == [a.replace(str(plain.qpc_dir), "D") for a in plain.command]
    script, plain_script = (d / "compile.sh").read_text(), (plain.qpc_dir / "compile.sh").read_text()
    assert script.replace(d.name, "D") == plain_script.replace(plain.qpc_dir.name, "D")
    assert '"-network-specialization-config=$HERE/specializations.json"' in script
    assert read_json(d / "qconfig.json")["specializations"] == read_json(d / "specializations.json")
    assert (d / "custom_io.yaml").read_text() == (plain.qpc_dir / "custom_io.yaml").read_text()


def test_ccl_named_format_numbers_prefill_and_decode(record, onnx):
    program = QaicBackend().compile(make_ccl_request(onnx, [3], ccl=[64], fmt="named"))
    doc = read_json(program.qpc_dir / "specializations.json")["specializations"]
    assert [(s["name"], s["symbols"]["seq_len"], s["symbols"]["comp_ctx_lengths"]) for s in doc] == [
        ("Prefill_0", "32", "64"), ("Prefill_1", "32", "128"), ("Decode_0", "4", "64"), ("Decode_1", "4", "128")]


def test_ccl_session_feeds_the_smallest_comp_ctx_lengths_that_holds_the_step(record, onnx, monkeypatch):
    names = [("input_ids", 0, 7, [1, 32]), ("position_ids", 0, 7, [1, 32]),
             ("past_key.0", 0, 6, [1, 1, 128, 4]), ("past_value.0", 0, 6, [1, 1, 128, 4]),
             ("comp_ctx_lengths", 0, 7, [128]), ("num_logits_to_keep", 0, 7, [1, 1]),
             ("past_key.0_RetainedState", 1, 6, [1, 1, 128, 4]),
             ("past_value.0_RetainedState", 1, 6, [1, 1, 128, 4]), ("logits", 1, 1, [1, 1, 11])]
    fake = FakeRuntime(11, [binding(i, *row) for i, row in enumerate(names)])
    monkeypatch.setattr(qaic_runtime, "load_runtime", lambda: (fake.qaicrt, fake.aicapi))
    session = QaicBackend().open_session(QaicBackend().compile(make_ccl_request(onnx, [0, 4])))
    fed = []
    for positions in ([[27, 28, 29, 30, 31]], [[28, 29, 30, 31, 32]], [[100, 101, 102, 103, 104]]):
        session.run(np.zeros((1, 5), dtype=np.int64), np.array(positions), num_logits_to_keep=5)
        fed.append(dict(zip([n for n, *_ in names], fake.runs[-1]))["comp_ctx_lengths"][1])
    assert fed == [[32], [64], [128]]
