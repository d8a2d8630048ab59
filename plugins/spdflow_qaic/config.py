"""The ``with:`` block of ``devices: {backend: qaic}``: compiler settings of DESIGN §4."""
from __future__ import annotations

from typing import Literal, Union

from pydantic import ConfigDict, Field

from spdflow.ccl import CclSettings


class QaicConfig(CclSettings):
    """qaic-compile's settings; the device group is the generic ``devices.device_ids``."""

    model_config = ConfigDict(extra="forbid")

    num_cores: int = Field(16, ge=1, le=64, description="AI cores per device (-aic-num-cores).")
    mxfp6_matmul: bool = Field(False, description="Compile matmul weights to MXFP6 (-mxfp6-matmul).")
    mxint8_kv_cache: bool = Field(
        False, description="Keep the KV cache as MXINT8 (the Precision of every past_* IO in custom_io.yaml)."
    )
    aic_hw_version: Literal["auto", "ai100", "ai200"] = Field(
        "auto",
        description="-aic-hw-version; 'auto' asks `qaic-util -q` (an AIC200 firmware image gives "
        "ai200) and falls back to ai100 where the SDK is absent, as QEfficient does.",
    )
    programs: Literal["both", "prefill", "decode"] = Field(
        "both",
        description="Which shapes the program holds: 'both', or only the prefill or only the decode "
        "shapes for disaggregated serving (QEfficient's prefill_only); spdflow generates only with 'both'.",
    )
    sub_functions: bool = Field(
        False, description="Compile repeated layers as ONNX sub-functions (-sub-functions)."
    )
    mdp_partition_file: str | None = Field(
        None,
        description="A user MDP partition config (JSON) used instead of the generated mdp_ts_<N>.json; "
        "copied into the program dir and passed as -mdp-load-partition-config.",
    )
    compiler: Literal["qaic-compile", "qaic-exec"] = Field(
        "qaic-compile", description="qaic-compile, or the legacy 'qaic-exec ... -compile-only'."
    )
    compiler_options: dict[str, Union[bool, int, str]] = Field(
        default_factory=dict,
        description="Extra compiler flags: key 'mos' with 1 gives -mos=1; true gives a bare flag.",
    )
    specializations_format: Literal["flat", "named"] = Field(
        "flat", description="specializations.json format: flat string values (default) or named."
    )
