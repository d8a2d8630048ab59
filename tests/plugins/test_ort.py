"""The onnxruntime backend (plugins/spdflow_ort): program layout, cache, and session semantics."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from spdflow.api import CompileRequest, ExportRequest, Specialization
from spdflow.errors import StageError
from spdflow.recipe.schema import DevicesSpec, ModelSpec
from spdflow_ort.config import OrtConfig
from spdflow.testing.models import make_tiny_model
from spdflow_onnx.export import export_model, load_hf_model
from spdflow_ort.backend import OrtBackend
from spdflow_ort.session import OrtSession

CTX = 64
PREFILL = 8
KS = [0, 1, 2, 4, 7]
NEW_TOKENS = 32


def specs_for(ks=KS, batch=1, full_batch_size=None):
    """Prefill + one decode shape per K (decode at full_batch_size under continuous batching)."""
    specs = [Specialization("prefill", batch, PREFILL, CTX, 1, full_batch_size)]
    decode_batch = full_batch_size or batch
    specs += [Specialization("decode", decode_batch, k + 1, CTX, k + 1, full_batch_size, k) for k in ks]
    return specs


class Built:
    """One tiny model: exported once, compiled on demand into the same export dir."""

    def __init__(self, root: Path, arch: str, continuous_batching: bool = False):
        self.root = root
        self.model_dir = make_tiny_model(root / "model", arch=arch)
        work = root / "export"
        work.mkdir()
        self.continuous_batching = continuous_batching
        self.export = export_model(ExportRequest(
            model=ModelSpec(id=arch), model_dir=self.model_dir, role="target",
            continuous_batching=continuous_batching, work_dir=work,
        ))
        self._hf = None

    @property
    def hf(self):
        if self._hf is None:
            self._hf = load_hf_model(self.model_dir)
        return self._hf

    def request(self, specs, ks=KS, **devices):
        return CompileRequest(
            onnx_path=self.export.onnx_path, export_dir=self.root / "export",
            specializations=specs, num_speculative_tokens=ks, devices=DevicesSpec(),
            backend_config=OrtConfig(**devices),
            model_info=self.export.model_info, role="target",
            continuous_batching=self.continuous_batching,
        )

    def compile(self, specs=None, **devices):
        return OrtBackend().compile(self.request(specs or specs_for(), **devices))

    def session(self, specs=None, in_place=True, **devices) -> OrtSession:
        program = self.compile(specs, **devices)
        if in_place:
            return OrtBackend().open_session(program, threads=1)
        return OrtSession(program.qpc_dir / "qpc", specializations=program.specializations,
                          vocab_size=4096, mode=program.session_mode, threads=1, in_place=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache: dict = {}

    def get(arch="llama", continuous_batching=False) -> Built:
        key = (arch, continuous_batching)
        if key not in cache:
            cache[key] = Built(tmp_path_factory.mktemp(f"{arch}-{continuous_batching}"), arch,
                               continuous_batching)
        return cache[key]

    return get


def prompt(length, seed=0):
    return np.random.default_rng(seed).integers(2, 4096, size=length)


def prefill(session, tokens, batch_index=None, row_positions=None):
    """Chunked prefill of one prompt (batch 1); returns the first generated token."""
    n = len(tokens)
    for start in range(0, n, PREFILL):
        chunk = tokens[start:start + PREFILL]
        ids = np.full((1, PREFILL), 1, dtype=np.int64)
        pos = np.full((1, PREFILL), -1, dtype=np.int64)
        ids[0, :len(chunk)] = chunk
        pos[0, :len(chunk)] = np.arange(start, start + len(chunk))
        logits = session.run(ids, pos, 1, batch_index)
    return int(logits[0, -1].argmax())


def greedy(session, tokens, steps=NEW_TOKENS):
    """Chunked prefill then 1-token decode; returns the generated tokens."""
    out = [prefill(session, tokens)]
    for step in range(steps - 1):
        position = len(tokens) + step
        logits = session.run(np.array([[out[-1]]]), np.array([[position]]), 1)
        out.append(int(logits[0, 0].argmax()))
    return out


def hf_greedy(model, tokens, steps=NEW_TOKENS):
    with torch.no_grad():
        out = model.generate(torch.tensor(tokens)[None], max_new_tokens=steps, do_sample=False,
                             eos_token_id=None, pad_token_id=1)
    return out[0, len(tokens):].tolist()


# ----------------------------------------------------------------------------- compile


def test_compile_writes_the_qpc_layout_with_shared_weights(models):
    built = models()
    program = built.compile()
    qpc = program.qpc_dir
    assert qpc.name == f"qpc-{program.key}" and len(program.key) == 16
    assert qpc.parent == built.root / "export"
    for name in ("specializations.json", "custom_io.yaml", "hashed_compile_params.json", "qconfig.json"):
        assert (qpc / name).is_file(), name
    specs = json.loads((qpc / "specializations.json").read_text())["specializations"]
    assert specs[0] == {"batch_size": "1", "seq_len": "8", "ctx_len": "64", "num_logits_to_keep": "1"}
    assert "IOName: past_key.0\n   Precision: float16" in (qpc / "custom_io.yaml").read_text()
    qconfig = json.loads((qpc / "qconfig.json").read_text())
    assert qconfig["num_speculative_tokens"] == KS
    assert qconfig["backend"]["name"] == "onnxruntime" and qconfig["backend"]["onnxruntime_version"]
    manifest = json.loads((qpc / "qpc" / "manifest.json").read_text())
    assert len(manifest["graphs"]) == len(specs_for())
    assert sorted(p.name for p in (qpc / "qpc").glob("*.data")) == ["model.onnx.data"]
    for graph in manifest["graphs"]:
        model = onnx.load(str(qpc / "qpc" / graph["file"]), load_external_data=False)
        locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        assert locations == {"model.onnx.data"}
        for value in list(model.graph.input) + list(model.graph.output):
            assert all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim), value.name
    assert not list(qpc.parent.glob(".qpc-*"))  # no temp dirs left behind


def test_compile_second_time_is_a_cache_hit(models):
    built = models()
    first = built.compile()
    second = built.compile()
    assert second.cached and second.key == first.key and second.reason == f"key {first.key}"  # the UI adds "cached"
    assert built.compile(specs_for([0, 4])).key != first.key


def test_compile_rebuilds_a_qpc_dir_without_manifest(models):
    built = models()
    program = built.compile(specs_for([3]))
    (program.qpc_dir / "qpc" / "manifest.json").unlink()
    again = built.compile(specs_for([3]))
    assert not again.cached and "not trusted ('qpc/manifest.json' is missing)" in again.reason
    assert (again.qpc_dir / "qpc" / "manifest.json").is_file()


def test_backend_is_registered_under_onnxruntime():
    from spdflow.plugins import get_plugin_manager

    registration = get_plugin_manager().lookup("backend", "onnxruntime")
    backend = registration.factory()
    assert backend.name == "onnxruntime" and backend.unavailable_reason() is None


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_tokens_match_hf_generate(models, arch):
    built = models(arch)
    tokens = prompt(13, seed=3)
    session = built.session()
    assert greedy(session, tokens) == hf_greedy(built.hf, tokens)


def test_static_and_dynamic_modes_give_identical_tokens(models):
    built = models()
    tokens = prompt(11, seed=4)
    static = greedy(built.session(session_mode="static"), tokens)
    dynamic = greedy(built.session(session_mode="dynamic"), tokens)
    assert static == dynamic


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_verify_step_equals_one_at_a_time_decode_after_stale_kv(models, k):
    built = models()
    session = built.session()
    tokens = prompt(13, seed=5)
    anchor = prefill(session, tokens)
    saved = {name: array.copy() for name, array in session.kv_cache().items()}
    step = np.concatenate([[anchor], prompt(k, seed=6)])
    start = len(tokens)
    sequential = []
    for j, token in enumerate(step):
        sequential.append(session.run(np.array([[token]]), np.array([[start + j]]), 1)[0, 0].copy())
    for name, array in session.kv_cache().items():
        array[...] = saved[name]  # back to the state right after prefill
    # Poison the slots the verify step will use, as rejected drafts would.
    junk = prompt(PREFILL, seed=7)[None]
    session.run(junk, np.arange(start, start + PREFILL)[None], 1)
    verify = session.run(step[None], np.arange(start, start + k + 1)[None], k + 1)[0]
    assert np.abs(verify - np.stack(sequential)).max() <= 1e-4
    assert (verify.argmax(-1) == np.stack(sequential).argmax(-1)).all()


def test_batch_of_two_with_padding_matches_per_prompt_runs(models):
    built = models()
    single = built.session()
    prompts = [prompt(13, seed=8), prompt(6, seed=9)]
    expected = [greedy(single, p, steps=8) for p in prompts]
    session = built.session(specs_for([0], batch=2), ks=[0])
    n = max(len(p) for p in prompts)
    first = [None, None]
    for start in range(0, n, PREFILL):
        ids = np.ones((2, PREFILL), dtype=np.int64)
        pos = np.full((2, PREFILL), -1, dtype=np.int64)
        for row, p in enumerate(prompts):
            chunk = p[start:start + PREFILL]
            ids[row, :len(chunk)] = chunk
            pos[row, :len(chunk)] = np.arange(start, start + len(chunk))
        logits = session.run(ids, pos, 1)
        for row, p in enumerate(prompts):
            if start <= len(p) - 1 < start + PREFILL:  # this chunk holds the row's last token
                first[row] = int(logits[row, 0].argmax())
    out = [[first[0]], [first[1]]]
    for step in range(7):
        ids = np.array([[out[0][-1]], [out[1][-1]]])
        pos = np.array([[len(prompts[0]) + step], [len(prompts[1]) + step]])
        logits = session.run(ids, pos, 1)
        for row in range(2):
            out[row].append(int(logits[row, 0].argmax()))
    assert out == expected


def test_continuous_batching_prefill_writes_only_its_kv_row(models):
    built = models("llama", continuous_batching=True)
    specs = specs_for([0, 2], full_batch_size=3)
    session = built.session(specs, ks=[0, 2])
    assert session.kv_batch_size == 3
    rng = np.random.default_rng(0)
    for array in session.kv_cache().values():
        array[...] = rng.standard_normal(array.shape)
    before = {name: array.copy() for name, array in session.kv_cache().items()}
    prefill(session, prompt(13, seed=10), batch_index=np.array([[1]]))
    for name, array in session.kv_cache().items():
        np.testing.assert_array_equal(array[[0, 2]], before[name][[0, 2]])
        assert not np.array_equal(array[1], before[name][1])


def test_continuous_batching_decode_matches_plain_batch_one(models):
    cb = models("llama", continuous_batching=True).session(specs_for([0], full_batch_size=3), ks=[0])
    plain = models("llama").session()
    prompts = {2: prompt(13, seed=11), 0: prompt(5, seed=12)}
    expected = {slot: greedy(plain, p, steps=6) for slot, p in prompts.items()}
    out = {slot: [prefill(cb, p, batch_index=np.array([[slot]]))] for slot, p in prompts.items()}
    for step in range(5):
        ids = np.ones((3, 1), dtype=np.int64)
        pos = np.full((3, 1), -1, dtype=np.int64)  # slot 1 is empty: padding
        for slot, p in prompts.items():
            ids[slot, 0], pos[slot, 0] = out[slot][-1], len(p) + step
        logits = cb.run(ids, pos, 1, np.arange(3).reshape(3, 1))
        for slot in prompts:
            out[slot].append(int(logits[slot, 0].argmax()))
    assert out == expected


@pytest.mark.parametrize("continuous_batching", [False, True])
def test_in_place_binding_is_bit_exact_against_plain_run(models, continuous_batching):
    built = models("llama", continuous_batching)
    fbs = 2 if continuous_batching else None
    specs = specs_for([0, 2], full_batch_size=fbs)
    in_place = built.session(specs, ks=[0, 2])
    copying = built.session(specs, in_place=False, ks=[0, 2])

    def index(batch):
        if not continuous_batching:
            return None
        # prefill (batch 1) into KV row 1; decode over every row
        return np.array([[1]]) if batch == 1 else np.arange(batch)[:, None]

    rows = fbs or 1
    steps = [(prompt(PREFILL, seed=13)[None], np.arange(PREFILL)[None], 1)]
    steps.append((np.tile([[7]], (rows, 1)), np.tile([[8]], (rows, 1)), 1))
    steps.append((np.tile([[9, 10, 11]], (rows, 1)), np.tile([[9, 10, 11]], (rows, 1)), 3))
    steps.append((np.tile([[12, 13, 14]], (rows, 1)), np.tile([[10, 11, -1]], (rows, 1)), 3))
    for ids, pos, nlk in steps:
        a = in_place.run(ids, pos, nlk, index(ids.shape[0])).copy()
        b = copying.run(ids, pos, nlk, index(ids.shape[0])).copy()
        np.testing.assert_array_equal(a, b)
        for name, array in in_place.kv_cache().items():
            np.testing.assert_array_equal(array, copying.kv_cache()[name])
    assert np.abs(next(iter(in_place.kv_cache().values()))).sum() > 0  # the cache was written


def test_run_with_uncompiled_shape_lists_the_allowed_ones(models):
    session = models().session(specs_for([0, 4]), ks=[0, 4])
    with pytest.raises(StageError, match=r"no compiled shape for batch 1, seq_len 3.*seq_len 5"):
        session.run(np.ones((1, 3), dtype=np.int64), np.arange(3)[None], 3)


def test_cuda_when_missing_is_backend_unavailable(models):
    import onnxruntime

    from spdflow.errors import BackendUnavailableError

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("CUDA is available here")
    with pytest.raises(BackendUnavailableError, match="CUDAExecutionProvider"):
        models().session(execution_provider="cuda")


def test_the_environment_reports_the_threads_a_session_really_runs_on():
    import os

    from spdflow_ort.session import OrtEnvironment

    env = OrtEnvironment()
    assert env.describe(3, False) == {"thread_pool": "per_session", "threads_requested": 3, "threads_effective": 3}
    assert env.describe(None, False)["threads_effective"] == os.cpu_count()
    env.pool_threads = 2  # an earlier session made the shared pool with 2 threads
    facts = env.describe(1, True)
    assert facts["threads_effective"] == 2 and "made with 2 threads" in facts["note"] and "1 were asked" in facts["note"]
    assert "note" not in env.describe(2, True) and "note" not in env.describe(None, True)


def test_spinning_auto_follows_the_weights_size_and_the_load(tmp_path):
    from spdflow_ort.backend import AUTO_SPINNING_MAX_BYTES, WEIGHTS, resolve_spinning

    (tmp_path / "qpc").mkdir()
    weights = tmp_path / "qpc" / WEIGHTS
    weights.write_bytes(b"")
    with weights.open("r+b") as f:  # sparse: sizes without writing them
        f.truncate(AUTO_SPINNING_MAX_BYTES - 1)
    assert resolve_spinning("auto", tmp_path) == (True, "auto: 64 MiB of weights, under 64 MiB")
    with weights.open("r+b") as f:
        f.truncate(AUTO_SPINNING_MAX_BYTES)
    spin, why = resolve_spinning("auto", tmp_path, machine=(3.0, 2))
    assert not spin and why == "auto: 64 MiB of weights on a busy machine (load 3.0 on 2 cores)"
    spin, why = resolve_spinning("auto", tmp_path, machine=(0.4, 2))
    assert spin and why == "auto: 64 MiB of weights on a quiet machine (load 0.4 on 2 cores)"
    assert resolve_spinning("auto", tmp_path, machine=(1.0, 2))[0] is False  # half the cores busy: busy
    assert resolve_spinning("on", tmp_path, machine=(9.0, 2)) == (True, "set in devices.with")
    assert resolve_spinning("on", tmp_path) == (True, "set in devices.with")
    assert resolve_spinning("off", tmp_path) == (False, "set in devices.with")


@pytest.mark.parametrize("pool", [None, 2])
def test_compile_says_spinning_stays_on_once_the_process_pool_exists(models, monkeypatch, pool):
    from dataclasses import replace

    from spdflow_ort import session as ort_session

    monkeypatch.setattr(ort_session.ENVIRONMENT, "pool_threads", pool)  # as a fresh process, or after an earlier session
    built, said = models(), []
    OrtBackend().compile(replace(built.request(specs_for()), backend_config=OrtConfig(spinning="off"), progress=said.append))
    line = next(line for line in said if line.startswith("thread spinning"))
    if pool is None:
        assert line == "thread spinning off (set in devices.with)"
    else:
        assert line.startswith("thread spinning on (set in devices.with gave off, but an earlier session of this process")


@pytest.mark.parametrize("spinning", ["on", "off"])
def test_spinning_choice_reaches_the_session_and_keeps_tokens(models, spinning):
    from spdflow_ort import session as ort_session

    # a fresh process's environment: no process-wide pool yet (ORT's own is per process, so a
    # pool made by an earlier test still exists; it only decides what "off" can get below)
    real_pool = ort_session.ENVIRONMENT.pool_threads
    built = models()
    tokens = prompt(9, seed=6)
    program = built.compile(spinning=spinning)
    assert program.spinning is (spinning == "on") and program.spinning_reason == "set in devices.with"
    session = OrtBackend().open_session(program, threads=1)
    facts = session.runtime_facts()
    if spinning == "on" or real_pool is not None:
        assert facts["spinning"] is True and facts["thread_pool"] == "shared"
        assert ("spinning_note" in facts) is (spinning == "off")
    else:
        assert facts["spinning"] is False and facts["thread_pool"] == "per_session"
    assert greedy(session, tokens) == hf_greedy(built.hf, tokens)


def test_spinning_off_runs_a_sleeping_pool_in_a_fresh_process(tmp_path):
    """In its own process (ORT's pools are per process): off gives a per-session pool that does not spin."""
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from spdflow_ort.session import session_options, ENVIRONMENT\n"
        "off = session_options(2, shared=False)\n"
        "on = session_options(2, shared=True)\n"
        "late_off = session_options(2, shared=False)\n"
        "print(json.dumps([off.use_per_session_threads, off.get_session_config_entry('session.intra_op.allow_spinning'),"
        " on.use_per_session_threads, late_off.use_per_session_threads, ENVIRONMENT.pool_threads]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[true, \"0\", false, false, 2]"
