"""The recipe: what a user writes in YAML, as pydantic v2 models.

Defaults live here and only here. Cross-field rules are small named functions in
``spdflow.recipe.checks``; plugin ``with:`` blocks are validated by the plugin's own model in
``spdflow.recipe.loader``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

#: The recipe's registration defaults, the only plugin names the core holds: the K policy a recipe
#: runs when it names none, which ``spdflow bench`` and ``spdflow whatif`` also run beside any other
#: policy as the reference (the simplest varK policy), and the CPU reference backend.
REFERENCE_POLICY = "smallest_covering"
DEFAULT_BACKEND = "onnxruntime"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ModelSpec(Strict):
    id: str = Field(
        description=(
            "The causal LM: 'spdflow:<name>' for an embedded model (spdflow:tinycode-target, "
            "spdflow:tinycode-draft), a local directory in Hugging Face format (relative paths "
            "are resolved against the recipe's folder), or a Hugging Face hub id already in the "
            "local HF cache. spdflow never downloads."
        )
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32",
        description="Weight dtype for export. QAIC compiles float32 models with -convert-to-fp16.",
    )
    revision: str | None = Field(
        None, description="Hub revision (branch, tag or commit) to take from the local HF cache."
    )


class ProposerSpec(Strict):
    uses: str = Field(
        description="Registered proposer name (see `spdflow plugins`), e.g. prompt_lookup, "
        "suffix, draft_model, synthetic."
    )
    with_: dict[str, Any] = Field(
        default_factory=dict,
        alias="with",
        description="The proposer's own settings, validated by that plugin's config model.",
    )


class SpecializationSpec(Strict):
    prefill_seq_len: int = Field(32, ge=1, le=65536, description="Tokens per prefill chunk (seq_len of the prefill shape).")
    ctx_len: int = Field(512, ge=2, le=1048576, description="KV cache length: prompt + generated tokens must fit below it.")
    batch_size: int = Field(1, ge=1, le=4096, description="Requests per step (without continuous batching).")
    full_batch_size: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Continuous batching: the number of KV slots requests join and leave. "
        "Prefill then runs at batch 1 and decode at full_batch_size.",
    )


class DevicesSpec(Strict):
    backend: str = Field(
        DEFAULT_BACKEND, description="Registered backend (see `spdflow plugins`), e.g. onnxruntime "
        "(CPU reference) or qaic."
    )
    device_ids: list[Annotated[int, Field(ge=0, le=4095)]] = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="Device group. More than one device compiles one program over the group.",
    )
    with_: dict[str, Any] = Field(
        default_factory=dict,
        alias="with",
        description="The backend's own settings, validated by that plugin's config model.",
    )


class KPolicySpec(Strict):
    uses: str = Field(
        REFERENCE_POLICY,
        description="Registered K policy (see `spdflow plugins`), e.g. smallest_covering, goodput, "
        "fixed, nospec.",
    )
    with_: dict[str, Any] = Field(
        default_factory=dict,
        alias="with",
        description="The K policy's own settings, validated by that plugin's config model.",
    )


def _name_means_uses(value: Any) -> Any:
    """A bare policy name stands for ``{uses: name}``."""
    return {"uses": value} if isinstance(value, str) else value


class WorkloadSpec(Strict):
    prompts: list[str] | None = Field(None, description="Prompts given inline.")
    file: str | None = Field(
        None,
        description="A .txt file (one prompt per line) or .jsonl file (objects with a 'prompt' key, or a 'messages' chat), "
        "relative to the recipe's folder.",
    )
    builtin: str | None = Field(
        None, description="A registered prompt set: 'code' (held-out stdlib code), 'rare', 'chat', 'edit' and 'qa' "
        "(chats for instruct models: rewrite a stdlib function; questions over a passage), and the evaluation-only "
        "'stdlib_tests' and 'thirdparty' (code of other kinds that no K-policy parameter was fitted on)."
    )
    count: int = Field(8, ge=1, le=100000, description="How many prompts to take from the source.")
    max_new_tokens: int = Field(64, ge=1, description="Tokens to generate per prompt at most.")
    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0 is greedy; > 0 samples.")
    top_k: int = Field(0, ge=0, description="Sample from the k most likely tokens (0: all).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int = Field(0, ge=0, description="Base seed; each request derives its own.")
    ignore_eos: bool = Field(False, description="Keep generating past the EOS token.")
    chat: bool | None = Field(
        None,
        description="Render prompts with the model's chat template (generation prompt added; the template's "
        "end-of-turn tokens stop generation). Default: chats (.jsonl lines with 'messages') and the built-in "
        "sets for instruct models (chat, edit, qa) are rendered, plain text is sent as it is; true renders plain "
        "prompts as user messages too; false sends plain text only.",
    )


class Recipe(Strict):
    version: Literal[1] = Field(description="Recipe format version; always 1.")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="Run name; names the output dir.")
    model: ModelSpec = Field(description="The target model (TLM).")
    proposer: ProposerSpec | None = Field(
        None, description="Where draft tokens come from; omit for a no-spec baseline."
    )
    num_speculative_tokens: list[int] = Field(
        default_factory=lambda: [0],
        description="The K-list: one decode shape of seq_len K+1 is compiled per K. An int means [K].",
    )
    k_policy: Annotated[KPolicySpec, BeforeValidator(_name_means_uses, json_schema_input_type=Union[str, KPolicySpec])] = Field(
        default_factory=KPolicySpec,
        description="How each step picks K: a registered policy name, or {uses: name, with: {...}}.",
    )
    acceptance: str = Field(
        "auto", description="greedy, rejection, or auto (greedy at temperature 0, else rejection)."
    )
    specialization: SpecializationSpec = Field(default_factory=SpecializationSpec, description="Compiled shapes.")
    devices: DevicesSpec = Field(default_factory=DevicesSpec, description="Backend and device settings.")
    workload: WorkloadSpec = Field(default_factory=lambda: WorkloadSpec(builtin="code"), description="Prompts and sampling.")
    output: str | None = Field(None, description="Output directory (default runs/<name>, relative to the current directory).")

    @field_validator("num_speculative_tokens", mode="before")
    @classmethod
    def _int_means_list(cls, value):
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        return value

    @field_validator("num_speculative_tokens")
    @classmethod
    def _k_nonnegative(cls, value: list[int]):
        if not value:
            raise ValueError("the K-list is empty; give at least one K, e.g. [0, 4]")
        bad = [k for k in value if k < 0 or k > 64]
        if bad:
            raise ValueError(f"K must be between 0 and 64, got {bad[0]}")
        return value

    def k_list(self) -> list[int]:
        """The sorted, deduplicated K-list the program is compiled for."""
        return sorted(set(self.num_speculative_tokens))

    def output_dir(self) -> Path:
        return Path(self.output) if self.output else Path("runs") / self.name
