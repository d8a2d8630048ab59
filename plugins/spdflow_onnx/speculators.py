"""Speculators that read the target's own last hidden state (post final norm).

* **Multi-projection heads** (QEfficient "Turbo", Medusa-1): ``speculator_config.json``
  (``turbo_num_layers``, ``turbo_num_heads``) and ``speculator.safetensors`` in the model
  directory. Head ``i`` (1-based) is a stack of residual blocks ``x + SiLU(Linear(x))`` and
  shares the target's LM head; it guesses the token ``i`` places after the one the base LM head
  predicts. Keys are ``projections.<head>.<block>.linear.{weight,bias}``, which is what
  QEfficient's ``build_and_attach_turbo`` loads (it strips ``projections.``). QEfficient builds a
  head as ``[ResBlock] * turbo_num_layers``, i.e. one block *shared* across the stack; the heads
  written by ``tools/train_heads.py`` use one block, where both readings agree.
* **EAGLE-1-style draft layer**: ``eagle_config.json`` + ``eagle.safetensors``. ``fc``
  (2·hidden → hidden, with bias) maps ``[embed(token_{t+1}), feature_t]`` to the input of one
  Llama decoder layer (no input norm, as EAGLE-1's first layer), whose output is the predicted
  feature ``feature_{t+1}``; the target's LM head turns it into the next-token guess. The
  target's embedding and LM head are read from the target, never stored here.

torch and transformers are imported here; the plugin's ``__init__`` imports this lazily.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

SPECULATOR_CONFIG = "speculator_config.json"
SPECULATOR_WEIGHTS = "speculator.safetensors"
EAGLE_CONFIG = "eagle_config.json"
EAGLE_WEIGHTS = "eagle.safetensors"


class SpeculatorFilesError(ValueError):
    """A speculator config or weights file is missing or does not fit the target."""


# ------------------------------------------------------------------------- multi-projection


class ResBlock(nn.Module):
    """``x + SiLU(Linear(x))``; zero weights make it the identity, so an untrained head
    starts as a copy of the base LM head."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def build_projections(hidden_size: int, num_heads: int, num_layers: int) -> nn.ModuleList:
    """``num_heads`` stacks of ``num_layers`` residual blocks (independent weights)."""
    return nn.ModuleList(
        nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers))) for _ in range(num_heads)
    )


def read_json(path: Path, required: tuple[str, ...]) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpeculatorFilesError(f"cannot read {path} ({exc})") from exc
    missing = [key for key in required if not isinstance(data.get(key), int) or data[key] < 1]
    if missing:
        raise SpeculatorFilesError(f"{path} needs positive integers for {', '.join(missing)}")
    return data


def read_speculator_config(model_dir: Path) -> dict | None:
    """The multi-projection config in ``model_dir``, or None when the directory has none."""
    path = Path(model_dir) / SPECULATOR_CONFIG
    if not path.is_file():
        return None
    config = read_json(path, ("turbo_num_layers", "turbo_num_heads"))
    if config.get("model_type", "turbo") != "turbo":
        raise SpeculatorFilesError(f"{path}: model_type must be 'turbo', not {config['model_type']!r}")
    if not (Path(model_dir) / SPECULATOR_WEIGHTS).is_file():
        raise SpeculatorFilesError(f"{path} exists but {SPECULATOR_WEIGHTS} is missing next to it")
    return config


def load_projections(model_dir: Path, hidden_size: int) -> nn.ModuleList:
    """The heads of ``model_dir``, loaded strictly (every key present, no extra key)."""
    from safetensors.torch import load_file

    config = read_speculator_config(model_dir)
    if config is None:
        raise SpeculatorFilesError(f"{model_dir} has no {SPECULATOR_CONFIG}")
    projections = build_projections(hidden_size, config["turbo_num_heads"], config["turbo_num_layers"])
    state = load_file(str(Path(model_dir) / SPECULATOR_WEIGHTS))
    state = {key.removeprefix("projections."): value for key, value in state.items()}
    try:
        projections.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise SpeculatorFilesError(f"{model_dir / SPECULATOR_WEIGHTS} does not fit the config: {exc}") from exc
    return projections.eval()


def projection_state(projections: nn.ModuleList) -> dict[str, torch.Tensor]:
    """The state dict under the key names QEfficient reads."""
    return {f"projections.{k}": v.detach().contiguous() for k, v in projections.state_dict().items()}


def project_hidden_states(hidden: torch.Tensor, projections: nn.ModuleList) -> torch.Tensor:
    """``[..., d]`` -> ``[..., heads+1, d]``: the hidden state itself, then each head's output."""
    return torch.stack([hidden] + [head(hidden) for head in projections], dim=-2)


# ------------------------------------------------------------------------------ EAGLE layer


def eagle_layer_config(target_config, intermediate_size: int | None = None):
    """A one-layer Llama config shaped like the target (hidden size, heads, RoPE)."""
    from transformers import LlamaConfig

    data = target_config.to_dict()
    data.update(num_hidden_layers=1)
    if intermediate_size:
        data.update(intermediate_size=intermediate_size)
    config = LlamaConfig(**{k: v for k, v in data.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "sdpa"
    return config


class EagleDraft(nn.Module):
    """``fc`` + one decoder layer; the target's embedding and LM head are passed in, not owned."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        self.config = config
        d = config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=True)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0)])
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE-1: the first layer has no input norm
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def fuse(self, token_embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([token_embeddings, features], dim=-1))

    def forward(self, token_embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Predicted features ``[b, s, d]`` for a whole causal sequence (training, no cache):
        row ``t`` reads ``embed(token_{t+1})`` and ``feature_t`` and predicts ``feature_{t+1}``."""
        hidden = self.fuse(token_embeddings, features)
        b, s, _ = hidden.shape
        position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
        cos_sin = self.rotary_emb(hidden, position_ids)
        out = self.layers[0](hidden, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out

    def state(self) -> dict[str, torch.Tensor]:
        """Weights to save: fc and the layer, without the (identity) input norm or RoPE buffers."""
        return {k: v.detach().contiguous() for k, v in self.state_dict().items() if "rotary_emb" not in k}


def eagle_config_json(config) -> dict:
    """What ``eagle_config.json`` records: enough to rebuild the layer next to its target."""
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "hidden_act", "max_position_embeddings", "vocab_size")
    data = {k: getattr(config, k) for k in keys}
    data.update(model_type="eagle", num_hidden_layers=1, rope_parameters=dict(config.rope_parameters),
                reuses_target=["embed_tokens", "lm_head"])
    return data


def read_eagle_config(model_dir: Path) -> dict | None:
    path = Path(model_dir) / EAGLE_CONFIG
    if not path.is_file():
        return None
    config = read_json(path, ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"))
    if config.get("model_type") != "eagle" or config.get("num_hidden_layers", 1) != 1:
        raise SpeculatorFilesError(f"{path}: expected model_type 'eagle' with num_hidden_layers 1")
    if not (Path(model_dir) / EAGLE_WEIGHTS).is_file():
        raise SpeculatorFilesError(f"{path} exists but {EAGLE_WEIGHTS} is missing next to it")
    return config


def load_eagle(model_dir: Path, target_config) -> EagleDraft:
    """The EAGLE layer of ``model_dir`` for ``target_config``, loaded strictly."""
    from safetensors.torch import load_file

    config = read_eagle_config(model_dir)
    if config is None:
        raise SpeculatorFilesError(f"{model_dir} has no {EAGLE_CONFIG}")
    if config["hidden_size"] != target_config.hidden_size or config["vocab_size"] != target_config.vocab_size:
        raise SpeculatorFilesError(
            f"{model_dir / EAGLE_CONFIG}: hidden_size/vocab_size {config['hidden_size']}/{config['vocab_size']} "
            f"do not match the target's {target_config.hidden_size}/{target_config.vocab_size}"
        )
    draft = EagleDraft(eagle_layer_config(target_config, config["intermediate_size"]))
    missing, unexpected = draft.load_state_dict(load_file(str(Path(model_dir) / EAGLE_WEIGHTS)), strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise SpeculatorFilesError(
            f"{model_dir / EAGLE_WEIGHTS} does not fit {EAGLE_CONFIG}: missing {missing}, unexpected {unexpected}"
        )
    return draft.eval()
