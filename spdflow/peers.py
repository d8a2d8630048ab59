"""Peers for ``spdflow bench --peers hf``: Hugging Face transformers on the same prompts and model.

Three peers, all greedy, same ``max_new_tokens``, same EOS rule (stop after the first EOS,
which is kept), token ids given directly (no re-tokenization):

* ``hf_greedy``        — ``model.generate`` (any batch size; left padding + attention mask);
* ``hf_prompt_lookup`` — ``generate(prompt_lookup_num_tokens=K)`` with K the recipe's largest K
  and ``max_matching_ngram_size`` the recipe's ``prompt_lookup_max`` (batch 1 only, as in HF);
* ``hf_assisted``      — ``generate(assistant_model=draft)`` with the recipe's draft model and
  ``num_assistant_tokens`` = the largest K, HF's own schedule otherwise (batch 1 only).

They run in a child process (``python -m spdflow.peers``, a JSON job on stdin, JSON runs on
stdout): torch's OpenMP pool busy-waits and would distort the ORT timings if it shared their
process (research/feasibility.md §4). The child rotates peer order across repeats like the bench.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PEER_MODES = ("hf_greedy", "hf_prompt_lookup", "hf_assisted")


# ------------------------------------------------------------------------------ parent side


def peer_job(loaded, recipe, info, requests, batch_size: int, repeats: int) -> dict[str, Any]:
    """The JSON job the child runs: model dirs, prompt ids, generation settings, which peers."""
    from spdflow.models import resolve_model_dir

    model_dir = resolve_model_dir(recipe.model.id, loaded.base_dir, recipe.model.revision,
                                  allow_outside=loaded.allow_outside_paths)
    proposer = recipe.proposer
    uses = proposer.uses if proposer is not None else None
    config = loaded.proposer_config
    modes = ["hf_greedy"]
    draft_dir = None
    if batch_size == 1 and uses == "prompt_lookup":
        modes.append("hf_prompt_lookup")
    if batch_size == 1 and uses == "draft_model":
        draft_dir = str(resolve_model_dir(config.model, loaded.base_dir, allow_outside=loaded.allow_outside_paths))
        modes.append("hf_assisted")
    return {
        "model_dir": str(model_dir), "draft_dir": draft_dir, "modes": modes,
        "prompts": [r.prompt_ids.tolist() for r in requests], "max_new_tokens": recipe.workload.max_new_tokens,
        "eos_token_ids": [] if recipe.workload.ignore_eos else list(info.eos_token_ids),
        "pad_token_id": info.pad_token_id, "batch_size": batch_size, "repeats": repeats,
        "k": max(recipe.k_list()), "ngram": getattr(config, "prompt_lookup_max", 2) if uses == "prompt_lookup" else 2,
        "threads": recipe.devices.with_.get("threads"),  # the backend's thread count, when it has one
    }


def run_hf_peers(loaded, recipe, info, requests, batch_size: int, repeats: int,
                 reference: dict[int, list[int]] | None) -> list[dict]:
    """Run the HF peers in a child process; rows shaped like the bench's."""
    if recipe.workload.temperature != 0:
        return []  # peers are greedy only; a sampled workload has nothing to compare with
    job = peer_job(loaded, recipe, info, requests, batch_size, repeats)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-m", "spdflow.peers"], input=json.dumps(job), capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        from spdflow.errors import StageError

        raise StageError(f"the HF peer process failed: {tail[0]}", hint="run `python -m spdflow.peers` with the job to see why")
    runs = json.loads(proc.stdout)
    return peer_rows(runs, batch_size, reference)


def peer_rows(runs: list[dict], batch_size: int, reference: dict[int, list[int]] | None) -> list[dict]:
    """Median/min/max over a peer's repeats, and whether its tokens equal spdflow's no-spec."""
    from spdflow.bench import _stats

    by_mode: dict[str, list[dict]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], []).append(run)
    rows = []
    for mode, mine in by_mode.items():
        row: dict[str, Any] = {"mode": mode, "batch_size": batch_size, "repeats": len(mine)}
        for key in ("requests_per_s", "tokens_per_s", "tpot_ms", "peak_rss_mb"):
            row[key], row[f"{key}_min"], row[f"{key}_max"] = _stats([r.get(key) for r in mine])
        row["al"] = None
        tokens = [{int(k): v for k, v in r["tokens"].items()} for r in mine]
        row["identical_to_nospec"] = None if reference is None else all(t == reference for t in tokens)
        row["generated_tokens"] = mine[0]["generated_tokens"]
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ child side


def _clip(tokens: list[int], eos: set[int]) -> list[int]:
    """Tokens up to and including the first EOS (what spdflow keeps)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


class _FirstTokenClock:
    """A generate() streamer that notes when the first generated token arrives (batch 1)."""

    def __init__(self):
        self.calls = 0
        self.first = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _generate(model, prompts: list[list[int]], job: dict, mode: str, assistant=None) -> tuple[list[list[int]], float, list]:
    """Greedy generate for a group of prompts; (new tokens per prompt, seconds, tpot values)."""
    import torch
    from transformers import GenerationConfig

    eos = job["eos_token_ids"]
    config = GenerationConfig(do_sample=False, max_new_tokens=job["max_new_tokens"], pad_token_id=job["pad_token_id"],
                              eos_token_id=eos or None, bos_token_id=None)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), job["pad_token_id"], dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):  # left padding
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    kwargs: dict[str, Any] = {}
    if mode == "hf_prompt_lookup":
        kwargs.update(prompt_lookup_num_tokens=job["k"], max_matching_ngram_size=job["ngram"])
    elif mode == "hf_assisted":
        kwargs.update(assistant_model=assistant)
        assistant.generation_config.num_assistant_tokens = job["k"]
    clock = _FirstTokenClock() if len(prompts) == 1 else None
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, streamer=clock, **kwargs)
    end = time.perf_counter()
    new = [_clip(out[row, width:].tolist(), set(eos)) for row in range(len(prompts))]
    tpots = []
    if clock is not None and clock.first is not None and len(new[0]) > 1:
        tpots.append((end - clock.first) / (len(new[0]) - 1))
    return new, end - start, tpots


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_peer(model, job: dict, mode: str, assistant=None) -> dict:
    """One timed pass of one peer over every prompt, in groups of the batch size."""
    prompts, b = job["prompts"], job["batch_size"] if mode == "hf_greedy" else 1
    tokens: dict[int, list[int]] = {}
    seconds, tpots = 0.0, []
    for start in range(0, len(prompts), b):
        group = prompts[start:start + b]
        new, elapsed, group_tpots = _generate(model, group, job, mode, assistant)
        seconds += elapsed
        tpots += group_tpots
        for offset, t in enumerate(new):
            tokens[start + offset] = t
    generated = sum(len(t) for t in tokens.values())
    return {"mode": mode, "requests_per_s": len(prompts) / seconds, "tokens_per_s": generated / seconds,
            "tpot_ms": statistics.median(tpots) * 1000 if tpots else None, "generated_tokens": generated,
            "peak_rss_mb": round(_peak_rss_mb(), 1), "tokens": tokens}


def run_job(job: dict) -> list[dict]:
    """Load the models, warm up, then every peer × repeat with the order rotated per repeat."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from spdflow.bench import run_order

    hf_logging.set_verbosity_error()
    torch.set_num_threads(job["threads"] or os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32).eval()
    assistant = None
    if job.get("draft_dir"):
        assistant = AutoModelForCausalLM.from_pretrained(job["draft_dir"], dtype=torch.float32).eval()
    _generate(model, job["prompts"][:1], job, "hf_greedy")  # warm-up, untimed
    return [run_peer(model, job, mode, assistant) for _, mode in run_order(job["modes"], job["repeats"])]


def main() -> None:
    """``python -m spdflow.peers``: a job (JSON) on stdin, the runs (JSON) on stdout."""
    job = json.loads(sys.stdin.read())
    json.dump(run_job(job), sys.stdout)


if __name__ == "__main__":
    main()
