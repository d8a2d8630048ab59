"""EAGLE proposer: one small decoder layer drafts from the target's own hidden states.

The target is exported with a ``hidden_states`` output (its final-norm states, the input of its
LM head) and the engine hands them over after every prefill and decode step
(``on_target_outputs``). The draft layer (``eagle_config.json`` + ``eagle.safetensors`` next to
the target, trained by ``tools/train_heads.py``) reads, at position ``t``, the embedding of token
``t+1`` and the target's feature ``f_t`` and predicts ``f_{t+1}``; the target's LM head turns
that into a guess of token ``t+2``. Drafting continues autoregressively on the layer's own
predicted features (EAGLE-1).

Per slot the layer keeps its own KV cache. ``fed`` counts the positions whose KV was computed
from the target's *true* features and tokens; at ``propose`` the committed positions after it
are caught up in one run (chunked by ``prefill_seq_len``), whose last row gives the first
guess, then the layer runs once per further token (seq_len 1). Speculative KV entries past
``fed`` are simply overwritten next time (the mask hides positions above the query).

The config declares the layer as an auxiliary model (role ``eagle``, graph ``eagle_layer``), so
the engine exports, specializes and compiles it as stages of its own (``export:eagle`` ...), on
every backend and under ``--compile-only``: on QAIC that is its own program (specializations,
custom IO, compiler command). At generation the proposer runs the exported layer with ONNX
Runtime on the host, whatever the backend (running it from its compiled program is not done
yet: the Session interface has no extra inputs). Built without the engine (``ctx`` without the
export), it exports the layer itself, cached under the run directory by the files' hash.
Proposals are point masses, so rejection sampling stays exact at T > 0.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from spdflow.api import AuxiliaryModel, Proposal, ProposeInput, Proposer, Request, TargetOutputs
from spdflow.errors import RecipeError, StageError

EAGLE_CONFIG = "eagle_config.json"
EAGLE_WEIGHTS = "eagle.safetensors"
PROGRAM = "eagle.onnx"


class EagleConfig(BaseModel):
    """The ``with:`` block of ``proposer: {uses: eagle}``."""

    model_config = ConfigDict(extra="forbid")

    num_speculative_tokens: int | None = Field(
        None, ge=1, description="Draft at most this many tokens per step (default: the step's k_max).",
    )
    min_confidence: float = Field(
        0.0, ge=0.0, le=1.0,
        description="Stop drafting when the layer's most likely token has a probability below this "
        "(0 always drafts k_max tokens).",
    )

    def auxiliary_models(self) -> list[AuxiliaryModel]:
        """The layer, built from the target's directory as its own program: a prefill shape
        (catch-up in chunks) and decode shapes for K=0 (one drafted token) and each K of the
        recipe (a catch-up of up to K+1 committed tokens)."""
        return [AuxiliaryModel(role="eagle", model_id=None, k_list=None, graph="eagle_layer")]


def build_program(model_dir: Path, run_dir: Path) -> tuple[Path, dict]:
    """The EAGLE ONNX program for ``model_dir`` (exported once, cached by the files' hash)."""
    from spdflow.engine import cache

    files = cache.dir_digest(model_dir, ("config.json", EAGLE_CONFIG, EAGLE_WEIGHTS, "*.safetensors"))
    key = cache.stage_key("eagle_program", "1", {}, files)
    target = Path(run_dir) / "export" / f"eagle-{key[:16]}"
    marker, _ = cache.read_done(target)
    if marker is not None and (target / PROGRAM).is_file():
        return target / PROGRAM, marker["facts"]
    from spdflow_onnx.eagle import export_eagle  # torch only when a program must be built

    target.mkdir(parents=True, exist_ok=True)
    facts = export_eagle(model_dir, target / PROGRAM)
    cache.write_done(target, {"facts": facts, "key": key})
    return target / PROGRAM, facts


class _Slot:
    def __init__(self, ctx_len: int, hidden: int, kv_shape: tuple[int, ...]):
        self.features = np.zeros((ctx_len, hidden), dtype=np.float32)
        self.known = 0  # target features known for positions < known
        self.fed = 0  # KV positions computed from true features and tokens
        self.key = np.zeros(kv_shape, dtype=np.float32)
        self.value = np.zeros(kv_shape, dtype=np.float32)


class EagleProposer(Proposer):
    """Autoregressive drafts from the EAGLE layer; see the module docstring."""

    name = "eagle"
    target_outputs = ("hidden_states",)

    def __init__(self, config: EagleConfig, ctx):
        import onnxruntime as ort
        from spdflow_ort.session import session_options

        self.config = config
        model_dir = Path(ctx.target.source_dir)
        if not (model_dir / EAGLE_CONFIG).is_file() or not (model_dir / EAGLE_WEIGHTS).is_file():
            raise RecipeError(
                f"proposer 'eagle' needs {EAGLE_CONFIG} and {EAGLE_WEIGHTS} in the target's directory {model_dir}",
                hint="train a layer with tools/train_heads.py, or use a target that ships one")
        meta = json.loads((model_dir / EAGLE_CONFIG).read_text(encoding="utf-8"))
        if meta.get("vocab_size") != ctx.target.vocab_size:
            raise RecipeError(f"{model_dir / EAGLE_CONFIG}: vocab_size {meta.get('vocab_size')} is not the "
                              f"target's {ctx.target.vocab_size}", hint="train the layer for this target")
        exported = getattr(ctx, "exported_graph", lambda role: None)("eagle")
        path = Path(exported) if exported is not None else build_program(model_dir, ctx.run_dir)[0]
        threads = getattr(ctx.recipe.devices, "threads", None)
        self.session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
        spec = ctx.recipe.specialization
        self.ctx_len = spec.ctx_len
        self.chunk = spec.prefill_seq_len
        shapes = {i.name: i.shape for i in self.session.get_inputs()}
        self.hidden = int(shapes["hidden_states"][2])
        heads, head_dim = shapes["past_key.0"][1], shapes["past_key.0"][3]
        self.kv_shape = (1, int(heads), self.ctx_len, int(head_dim))
        self.nlk = np.zeros((1, 1), dtype=np.int64)
        # The engine's export follows the recipe: a continuous-batching graph takes batch_index
        # (row 0 of this slot's one-row cache), a CCL graph comp_ctx_lengths (read every slot).
        self.extra_feeds = {}
        if "batch_index" in shapes:
            self.extra_feeds["batch_index"] = np.zeros((1, 1), dtype=np.int64)
        if "comp_ctx_lengths" in shapes:
            self.extra_feeds["comp_ctx_lengths"] = np.zeros(self.ctx_len, dtype=np.int64)
        self.slots: dict[int, _Slot] = {}

    # -- engine callbacks ---------------------------------------------------------------------

    def add_request(self, slot: int, request: Request) -> None:
        self.slots[slot] = _Slot(self.ctx_len, self.hidden, self.kv_shape)

    def on_target_outputs(self, slot: int, outputs: TargetOutputs) -> None:
        state = self.slots.get(slot)
        if state is None or outputs.hidden_states is None:
            return
        positions = outputs.positions
        if len(positions) != len(outputs.hidden_states):
            raise StageError(f"eagle: {len(outputs.hidden_states)} hidden-state rows for {len(positions)} positions")
        state.features[positions] = outputs.hidden_states
        state.known = int(positions[-1]) + 1
        state.fed = min(state.fed, int(positions[0]))  # rows before these were never rewritten

    def remove_request(self, slot: int) -> None:
        self.slots.pop(slot, None)

    # -- drafting -----------------------------------------------------------------------------

    def _run(self, state: _Slot, ids: np.ndarray, feats: np.ndarray, positions: np.ndarray):
        logits, hidden, key, value = self.session.run(None, {
            "input_ids": ids[None], "hidden_states": feats[None].astype(np.float32), "position_ids": positions[None],
            "past_key.0": state.key, "past_value.0": state.value, "num_logits_to_keep": self.nlk,
            **self.extra_feeds})
        state.key, state.value = key, value
        return logits[0, -1], hidden[0, -1]

    def _draft(self, state: _Slot, tokens: np.ndarray, k: int) -> np.ndarray:
        n = len(tokens)  # the anchor is tokens[n-1]; the target's features reach n-2
        if state.known != n - 1 or k == 0:
            return np.zeros(0, dtype=np.int64)
        # catch up: row t reads token t+1 and feature t, for t = fed .. n-2
        logits = feature = None
        for lo in range(state.fed, n - 1, self.chunk):
            hi = min(lo + self.chunk, n - 1)
            positions = np.arange(lo, hi, dtype=np.int64)
            logits, feature = self._run(state, tokens[lo + 1:hi + 1], state.features[lo:hi], positions)
        state.fed = n - 1
        if logits is None:
            return np.zeros(0, dtype=np.int64)
        out = []
        for step in range(k):
            token = int(np.argmax(logits))
            if self.config.min_confidence and self._top_probability(logits) < self.config.min_confidence:
                break
            out.append(token)
            if step + 1 == k:
                break
            position = np.array([n - 1 + step], dtype=np.int64)
            logits, feature = self._run(state, np.array([token], dtype=np.int64), feature[None], position)
        return np.asarray(out, dtype=np.int64)

    @staticmethod
    def _top_probability(logits: np.ndarray) -> float:
        shifted = logits - logits.max()
        return float(1.0 / np.exp(shifted).sum())

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        proposals = []
        for item in inputs:
            state = self.slots.get(item.slot)
            k = min(item.k_max, self.config.num_speculative_tokens or item.k_max)
            if state is None:
                proposals.append(Proposal.empty())
                continue
            proposals.append(Proposal(self._draft(state, np.asarray(item.tokens, dtype=np.int64), k)))
        return proposals

    def close(self) -> None:
        self.slots.clear()
