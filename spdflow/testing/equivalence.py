"""spdflow no-spec greedy against Hugging Face transformers greedy on the same model and prompt ids.

Used by ``tests/test_hf_equivalence.py`` (the embedded model) and ``benchmarks/hf_equivalence.py``
(a real model). HF runs ``model.generate(do_sample=False)`` on the prompt ids spdflow fed its own
session (chat-rendered, same tokenizer), with the same ``max_new_tokens`` and the same stop ids
(spdflow's EOS ids, which include a chat template's end-of-turn ids); both keep the stop token.
Where the two differ, the first differing position is reported with HF's top-2 logit gap there:
a gap below :data:`NEAR_TIE` is an fp32 near-tie (summation order decides), anything else is a bug.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: A top-2 logit gap below this at the first differing position counts as an fp32 near-tie.
NEAR_TIE = 1e-4


@dataclass
class Comparison:
    request: int
    prompt_tokens: int
    spdflow_tokens: list[int]
    hf_tokens: list[int]
    first_difference: int | None = None
    top2_gap: float | None = None  # HF's logit gap between its top two tokens at the first difference
    hf_token: int | None = None
    spdflow_token: int | None = None

    @property
    def identical(self) -> bool:
        return self.spdflow_tokens == self.hf_tokens

    @property
    def near_tie(self) -> bool:
        return self.top2_gap is not None and self.top2_gap < NEAR_TIE


@dataclass
class Summary:
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def identical(self) -> int:
        return sum(c.identical for c in self.comparisons)

    @property
    def near_ties(self) -> int:
        return sum((not c.identical) and c.near_tie for c in self.comparisons)

    @property
    def unexplained(self) -> list[Comparison]:
        return [c for c in self.comparisons if not c.identical and not c.near_tie]


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, eos_ids: list[int], dtype: str = "float32"):
    """[(generated ids, raw logits per step)] of HF greedy generation, one prompt at a time."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=getattr(torch, dtype)).eval()
    results = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                                 eos_token_id=list(eos_ids) or None, pad_token_id=(list(eos_ids) or [0])[0],
                                 output_logits=True, return_dict_in_generate=True,
                                 temperature=None, top_p=None, top_k=None, repetition_penalty=None)
            generated = out.sequences[0, len(ids):].tolist()
            results.append((generated, [step[0].float() for step in out.logits]))
    del model
    return results


def compare(outputs: list[dict], model_dir: Path, max_new_tokens: int, eos_ids: list[int]) -> Summary:
    """Compare spdflow's ``outputs`` (outputs.jsonl rows: prompt_tokens, tokens) with HF greedy."""
    import torch

    reference = hf_greedy(model_dir, [o["prompt_tokens"] for o in outputs], max_new_tokens, eos_ids)
    summary = Summary()
    for output, (hf_tokens, logits) in zip(outputs, reference):
        ours = list(output["tokens"])
        item = Comparison(output["request"], len(output["prompt_tokens"]), ours, hf_tokens)
        if not item.identical:
            at = next((i for i, (a, b) in enumerate(zip(ours, hf_tokens)) if a != b), min(len(ours), len(hf_tokens)))
            item.first_difference = at
            if at < len(logits):
                top = torch.topk(logits[at], 2).values
                item.top2_gap = float(top[0] - top[1])
                item.hf_token = hf_tokens[at] if at < len(hf_tokens) else None
                item.spdflow_token = ours[at] if at < len(ours) else None
        summary.comparisons.append(item)
    return summary
