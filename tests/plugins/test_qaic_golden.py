"""Golden contract tests: what the qaic backend writes against what QEfficient 1.22 wrote.

``tests/fixtures/qefficient-1.22/`` holds QEfficient's own output for nine compile() settings
on the embedded tinycode-target (README there). For the same settings spdflow's
specializations.json (named, and flat), custom_io.yaml, mdp_ts_4.json and compiler argv must
equal QEfficient's once paths are normalised and JSON whitespace removed, except for the
differences spdflow keeps on purpose: ``KEPT`` below, each a row of the table in docs/qaic.md.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spdflow.api import CompileRequest, ModelInfo
from spdflow.recipe.schema import DevicesSpec
from spdflow_qaic.backend import plan_compile
from spdflow_qaic.config import QaicConfig
from spdflow_shapes import specialize

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "qefficient-1.22"
CASES = json.loads((REFERENCE / "cases.json").read_text())
#: The embedded tinycode-target, the model the reference was captured on.
MODEL = ModelInfo(
    name="tinycode-target", model_type="llama", vocab_size=4096, num_layers=4, num_kv_heads=2,
    head_dim=64, eos_token_ids=(0,), pad_token_id=1, source_dir=Path("/nowhere"), tokenizer_file=None,
)
COMPILER = "/opt/qti-aic/exec/qaic-compile"


def _case_dir(case: str) -> Path:
    return REFERENCE / "cases" / case


def _request(case: str, onnx: Path, fmt: str) -> CompileRequest:
    kwargs = CASES[case]["kwargs"]
    ks = kwargs["num_speculative_tokens"]
    ks = ks if isinstance(ks, list) else [ks]
    fbs = kwargs.get("full_batch_size")
    return CompileRequest(
        onnx_path=onnx,
        export_dir=onnx.parent,
        specializations=specialize(ks, kwargs["prefill_seq_len"], kwargs["ctx_len"], 1, fbs),
        num_speculative_tokens=ks,
        devices=DevicesSpec(backend="qaic", device_ids=list(range(kwargs["num_devices"]))),
        backend_config=QaicConfig(
            num_cores=kwargs["num_cores"], mxint8_kv_cache=kwargs["mxint8_kv_cache"],
            mxfp6_matmul=kwargs["mxfp6_matmul"], specializations_format=fmt,
        ),
        model_info=MODEL,
        role="target",
        continuous_batching=fbs is not None,
        dtype="float32",
    )


@pytest.fixture
def plan(tmp_path, monkeypatch):
    """plan(case, fmt) -> the CompilePlan spdflow makes for the case's settings."""
    monkeypatch.delenv("QAIC_COMPILER", raising=False)  # the SDK path, as QEfficient names it
    onnx = tmp_path / "export-0123" / "model.onnx"
    onnx.parent.mkdir()
    onnx.write_bytes(b"not really onnx")
    return lambda case, fmt="named": plan_compile(_request(case, onnx, fmt))


def _squeeze(text: str) -> str:
    """JSON text without whitespace: equal key order and values, any indentation."""
    return re.sub(r"\s+", "", text)


# ------------------------------------------------------------------- kept differences


def _keep_k_equal_to_prefill(case: str, named: list[dict]) -> list[dict]:
    """QEfficient drops the decode shape whose seq_len equals prefill's (K+1 == 32), though its
    num_logits_to_keep differs; the runtime would then miss the K=31 step. spdflow keeps it."""
    if case != "k31_bs1_d1_mx":
        return named
    assert [e["name"] for e in named] == ["Prefill", "Decode"]
    k31 = {**named[1]["symbols"], "num_logits_to_keep": "32", "seq_len": "32"}
    return [named[0], {**named[1], "name": "Decode_0"}, {"name": "Decode_1", "symbols": k31}]


def _mdp_file_in_program_dir(argv: list[str]) -> list[str]:
    """QEfficient writes mdp_ts_N.json once per export dir, so two compiles with different
    core counts overwrite each other's; spdflow writes it into the program dir it belongs to."""
    return [arg.replace("<export>/mdp_ts_", "<qpc>/mdp_ts_") for arg in argv]


KEPT = {"specializations": _keep_k_equal_to_prefill, "argv": _mdp_file_in_program_dir}


def _expected_named(case: str) -> list[dict]:
    named = json.loads((_case_dir(case) / "specializations.json").read_text())["specializations"]
    return KEPT["specializations"](case, named)


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("case", sorted(CASES))
def test_named_specializations_equal_qefficient(case, plan):
    text = plan(case, "named").files["specializations.json"]
    expected = {"specializations": _expected_named(case)}
    assert json.loads(text) == expected
    assert _squeeze(text) == _squeeze(json.dumps(expected, sort_keys=True))
    if case != "k31_bs1_d1_mx":  # byte for byte where nothing is kept different
        reference = (_case_dir(case) / "specializations.json").read_text()
        assert text.rstrip("\n") == reference.rstrip("\n")


@pytest.mark.parametrize("case", sorted(CASES))
def test_flat_specializations_are_the_named_symbols(case, plan):
    flat = json.loads(plan(case, "flat").files["specializations.json"])
    assert flat == {"specializations": [entry["symbols"] for entry in _expected_named(case)]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_custom_io_yaml_equals_qefficient(case, plan):
    assert plan(case).files["custom_io.yaml"] == (_case_dir(case) / "custom_io.yaml").read_text()


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c]["kwargs"]["num_devices"] > 1))
def test_mdp_partition_config_equals_qefficient(case, plan):
    text = plan(case).files["mdp_ts_4.json"]
    reference = (_case_dir(case) / "mdp_ts_4.json").read_text()
    assert json.loads(text) == json.loads(reference)
    assert text.rstrip("\n") == reference.rstrip("\n")


def _normalise_reference(argv: list[str]) -> list[str]:
    def one(arg: str) -> str:
        arg = re.sub(r"\$QEFF_HOME/\w+/[\w-]+/qpc-[0-9a-f]{16}", "<qpc>", arg)
        arg = re.sub(r"\$QEFF_HOME/\w+/[\w-]+/\w+\.onnx", "<onnx>", arg)
        return re.sub(r"\$QEFF_HOME/\w+/[\w-]+", "<export>", arg)

    return [one(arg) for arg in argv]


def _normalise_ours(argv: list[str], plan) -> list[str]:
    onnx = str(plan.params.get("onnx_path", "")) or None
    out = []
    for arg in argv:
        arg = arg.replace(str(plan.qpc_dir), "<qpc>")
        if onnx:
            arg = arg.replace(onnx, "<onnx>")
        out.append(re.sub(r"=\S*/model\.onnx$", "=<onnx>", arg))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiler_argv_equals_qefficient(case, plan):
    made = plan(case)
    ours = _normalise_ours(made.command, made)
    expected = KEPT["argv"](_normalise_reference(CASES[case]["argv"]))
    assert expected[0] == ours[0] == COMPILER
    assert ours == expected


@pytest.mark.parametrize("case", sorted(CASES))
def test_argv_normalisation_leaves_no_machine_path(case, plan):
    made = plan(case)
    for arg in _normalise_ours(made.command, made)[1:] + _normalise_reference(CASES[case]["argv"])[1:]:
        assert "$QEFF_HOME" not in arg and str(made.qpc_dir.parent) not in arg, arg
