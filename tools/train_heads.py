"""Train the embedded target's own speculators: multi-projection heads and an EAGLE layer.

    python tools/train_heads.py                       # both, into spdflow/zoo/tinycode-target
    python tools/train_heads.py --out /tmp/h --resume # continue an interrupted run
    python tools/train_heads.py --out /tmp/h --prompts 16 --head-steps 3 --eagle-steps 3  # smoke

What it does (Medusa-1 "self-distillation", EAGLE-1 training; base model frozen throughout):

1. **Data.** Function openings cut (as the ``code`` workload cuts them) from the stdlib files
   of the *training* split (zoo/README.md; held-out files are never read), a seeded pick of
   ``--prompts`` of them, each continued greedily by the target for ``--new-tokens`` tokens.
   Prompts are grouped by length and cut from the left to the group's shortest, so no padding
   enters a batch. One forward pass then records the target's last hidden state (after the
   final norm, the input of its LM head) for every position. Kept in ``OUT/data.pt``.
2. **Heads** (``speculator_config.json`` + ``speculator.safetensors``): head ``i`` maps the
   hidden state at ``t`` through one residual block ``x + SiLU(Linear(x))`` and the target's
   LM head to the token at ``t+1+i``; cross-entropy on the generated part, where every label is
   the target's own greedy token. Zero-initialised blocks, AdamW, cosine learning rate.
3. **EAGLE layer** (``eagle_config.json`` + ``eagle.safetensors``): row ``t`` reads
   ``[embed(x_{t+1}), f_t]`` and predicts ``f_{t+1}``; loss = SmoothL1(f̂, f) + ``--eagle-cls-weight``
   (1.0; EAGLE-1 uses 0.1) · cross-entropy against the target's own next-token distribution
   LM head(f_{t+1}), with uniform feature noise (±0.1) as in EAGLE-1, plus ``--eagle-unroll``
   (1.0) times the same loss on a second pass that reads the layer's own (detached) predicted
   features, as drafting does from the second token on (a one-step "training-time test" as in
   HASS / EAGLE-3; without it the second draft token was almost never accepted).
4. **Offline acceptance**: on held-out ``code`` prompts the greedy speculative loop is
   simulated exactly in torch (proposals compared with the target's greedy continuation) and
   the mean accepted length per step (AL, bonus token included) is written into each record.

Deterministic for a given machine and thread count (``--threads``, seeds fixed, fixed step
counts; ``--minutes`` only pauses). Resumable: ``OUT/checkpoint.pt`` holds the finished stages
and the running one (saved every ``--checkpoint-every`` steps); ``--resume`` continues. Wall
times of the committed run are in the records (``data_minutes``, ``train_minutes``,
``eval_minutes``, with the load average): on one thread of a shared 2-core machine at load 7-8,
data 5 minutes, heads 6 and the EAGLE layer 18 minutes of training.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "plugins")]  # run from a checkout without installing

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from spdflow_onnx import speculators as spec  # noqa: E402
from spdflow_workloads import _prompts_in_file, code_prompts, is_held_out, stdlib_dir  # noqa: E402

from spdflow.zoo import zoo_path  # noqa: E402

EOS = 0


def log(message: str) -> None:
    print(f"[train_heads] {message}", file=sys.stderr, flush=True)


def save_atomic(obj, path: Path) -> None:
    temp = path.with_suffix(".tmp")
    torch.save(obj, temp)
    os.replace(temp, path)


def checkpoint(args, state: dict, key: str, model, opt, step: int, seconds: float) -> None:
    """Every ``checkpoint_every`` steps (and at the deadline) save ``model`` and ``opt`` under
    ``state[key]``, resumable; past the deadline, stop with TimeoutError."""
    late = bool(args.deadline and time.time() > args.deadline)
    if (step + 1) % args.checkpoint_every == 0 or late:
        state[key] = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1, "seconds": seconds}
        save_atomic(state, args.work / "checkpoint.pt")
        if late:
            raise TimeoutError


def write_json(path: Path, data: dict) -> None:
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temp, path)


# ------------------------------------------------------------------------------------ data


def training_prompts(count: int, seed: int) -> list[str]:
    """``count`` function openings from the training split (the held-out rule inverted)."""
    root = stdlib_dir()
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("site-packages", "__pycache__", "idlelib"))
        base = Path(directory).relative_to(root).as_posix()
        for name in sorted(names):
            relative = name if base == "." else f"{base}/{name}"
            if name.endswith(".py") and not name.startswith("test_") and not is_held_out(relative):
                files.append(relative)
    random.Random(seed).shuffle(files)
    prompts: list[str] = []
    for relative in files:
        found = _prompts_in_file(root, relative)
        random.Random(f"{seed}:{relative}").shuffle(found)
        prompts += [p.text for p in found[:3]]  # at most 3 per file: spread over the library
        if len(prompts) >= count:
            break
    return prompts[:count]


@torch.no_grad()
def greedy_continue(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """``ids`` [b, p] followed by ``new_tokens`` greedy tokens (EOS repeats once reached)."""
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=EOS, eos_token_id=None)
    return out


@torch.no_grad()
def build_data(model, tokenizer, prompts: list[str], new_tokens: int, batch: int) -> dict:
    """Token rows, hidden states and where generation starts, batched by prompt length."""
    encoded = sorted((tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts), key=len)
    groups = []
    for start in range(0, len(encoded), batch):
        rows = encoded[start:start + batch]
        cut = min(len(r) for r in rows)
        ids = torch.tensor([r[len(r) - cut:] for r in rows], dtype=torch.int64)
        seqs = greedy_continue(model, ids, new_tokens)
        hidden = model.model(input_ids=seqs).last_hidden_state
        groups.append({"tokens": seqs, "hidden": hidden.to(torch.float32), "prompt_len": cut})
        log(f"data: {start + len(rows)}/{len(encoded)} prompts continued")
    return {"groups": groups}


def generated_positions(data: dict):
    """(hidden rows, token rows, offsets) of every generated-part position, flattened."""
    hidden, tokens, starts = [], [], []
    for group in data["groups"]:
        hidden.append(group["hidden"])
        tokens.append(group["tokens"])
        starts.append(group["prompt_len"] - 1)
    return hidden, tokens, starts


# ----------------------------------------------------------------------------------- heads


def head_batches(data: dict, num_heads: int, batch: int, steps: int, seed: int):
    """Per step: (hidden [n, d], labels [n, heads]) sampled from the generated positions."""
    samples_h, samples_y = [], []
    for group in data["groups"]:
        tokens, hidden, p = group["tokens"], group["hidden"], group["prompt_len"]
        last = tokens.shape[1] - 1 - num_heads  # t + 1 + heads must be a real token
        for t in range(p - 1, last):
            samples_h.append(hidden[:, t])
            samples_y.append(torch.stack([tokens[:, t + 1 + i] for i in range(1, num_heads + 1)], dim=1))
    all_h, all_y = torch.cat(samples_h), torch.cat(samples_y)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        pick = torch.randint(0, all_h.shape[0], (batch,), generator=gen)
        yield all_h[pick], all_y[pick]


LR_SCHEDULE = "linear warm-up over the first 5 % of steps, then cosine from lr_max down to 0.1 * lr_max"
EAGLE_STEPS = 800
EAGLE_UNROLL = 1.0


def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


def train_heads(model, data: dict, args, state: dict) -> torch.nn.ModuleList:
    d = model.config.hidden_size
    heads = spec.build_projections(d, args.heads, args.head_layers)
    opt = torch.optim.AdamW(heads.parameters(), lr=args.head_lr, weight_decay=0.0)
    start, spent = 0, 0.0
    if "heads_running" in state:
        heads.load_state_dict(state["heads_running"]["model"])
        opt.load_state_dict(state["heads_running"]["opt"])
        start, spent = state["heads_running"]["step"], state["heads_running"].get("seconds", 0.0)
    lm_head = model.lm_head
    batches = head_batches(data, args.heads, args.head_batch, args.head_steps, args.seed)
    losses = state.setdefault("heads_log", [])
    began = time.time()
    for step, (h, y) in enumerate(batches):
        if step < start:
            continue
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.head_steps, args.head_lr)
        loss = sum(F.cross_entropy(lm_head(head(h)), y[:, i]) for i, head in enumerate(heads)) / args.heads
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.head_steps - 1:
            losses.append({"step": step, "loss": round(loss.item(), 4), "t": round(spent + time.time() - began, 1)})
            log(f"heads step {step}/{args.head_steps} loss {loss.item():.3f}")
        checkpoint(args, state, "heads_running", heads, opt, step, spent + time.time() - began)
    state.pop("heads_running", None)
    state["heads_seconds"] = spent + time.time() - began
    return heads.eval()


# ----------------------------------------------------------------------------------- EAGLE


def eagle_sequences(data: dict):
    """(tokens [n, T], features [n, T, d]) rows; groups differ in T so they stay separate."""
    return [(g["tokens"], g["hidden"]) for g in data["groups"]]


def soft_cross_entropy(model, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of LM head(pred) against the target's own next-token distribution
    LM head(target) (EAGLE-1's classification loss)."""
    vocab = model.lm_head.weight.shape[0]
    with torch.no_grad():
        p = torch.softmax(model.lm_head(target).reshape(-1, vocab), dim=-1)
    return -(p * torch.log_softmax(model.lm_head(pred).reshape(-1, vocab), dim=-1)).sum(-1).mean()


def eagle_loss(draft, model, tokens, feats, noise: float, gen: torch.Generator | None, cls_weight: float,
               unroll: float):
    """EAGLE-1 loss on rows ``t = 0 .. T-3``: predict f_{t+1} (smooth L1) and the target's
    distribution of token t+2 (soft cross-entropy). With ``unroll`` > 0 a second pass feeds the
    layer its own (detached) predicted features, as drafting does from the second token on,
    and adds that pass's loss times ``unroll`` (a one-step "training-time test", as HASS and
    EAGLE-3 do it, without their tree masks)."""
    emb = model.model.embed_tokens(tokens[:, 1:-1])
    inp = feats[:, :-2]
    if noise:
        inp = inp + (torch.rand(inp.shape, generator=gen) * 2 - 1) * noise
    pred = draft(emb, inp)
    target = feats[:, 1:-1]
    regression = F.smooth_l1_loss(pred, target)
    classification = soft_cross_entropy(model, pred, target)
    loss = regression + cls_weight * classification
    if unroll:
        # row t' = t+1 reads token t'+1 and the predicted feature of t' (made from f_{t'-1})
        pred2 = draft(model.model.embed_tokens(tokens[:, 2:-1]), pred[:, :-1].detach())
        target2 = feats[:, 2:-1]
        loss = loss + unroll * (F.smooth_l1_loss(pred2, target2) + cls_weight * soft_cross_entropy(model, pred2, target2))
    return loss, regression, classification


def train_eagle(model, data: dict, args, state: dict) -> spec.EagleDraft:
    torch.manual_seed(args.seed)
    draft = spec.EagleDraft(spec.eagle_layer_config(model.config, args.eagle_intermediate))
    # Start the layer from the target's last layer: same shapes, a far better start than random.
    last = model.model.layers[-1].state_dict()
    draft.layers[0].load_state_dict({k: v for k, v in last.items() if "input_layernorm" not in k}, strict=False)
    with torch.no_grad():  # fc starts as "take the feature half"
        draft.fc.weight.zero_()
        draft.fc.bias.zero_()
        d = model.config.hidden_size
        draft.fc.weight[:, d:] = torch.eye(d)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.eagle_lr, weight_decay=0.0)
    start, spent = 0, 0.0
    if "eagle_running" in state:
        draft.load_state_dict(state["eagle_running"]["model"])
        opt.load_state_dict(state["eagle_running"]["opt"])
        start, spent = state["eagle_running"]["step"], state["eagle_running"].get("seconds", 0.0)
    seqs = eagle_sequences(data)
    order = random.Random(args.seed)
    picks = [(order.randrange(len(seqs)), order.random()) for _ in range(args.eagle_steps)]
    losses = state.setdefault("eagle_log", [])
    began = time.time()
    for step, (gi, frac) in enumerate(picks):
        noise_gen = torch.Generator().manual_seed(args.seed * 1000003 + step)
        if step < start:
            continue
        tokens, feats = seqs[gi]
        tokens, feats = tokens[:, -args.eagle_window:], feats[:, -args.eagle_window:]
        n = tokens.shape[0]
        rows = torch.randperm(n, generator=torch.Generator().manual_seed(step))[: args.eagle_batch]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.eagle_steps, args.eagle_lr)
        loss, reg, cls = eagle_loss(draft, model, tokens[rows], feats[rows], 0.1, noise_gen,
                                    args.eagle_cls_weight, args.eagle_unroll)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.eagle_steps - 1:
            losses.append({"step": step, "loss": round(loss.item(), 4), "regression": round(reg.item(), 4),
                           "classification": round(cls.item(), 4), "t": round(spent + time.time() - began, 1)})
            log(f"eagle step {step}/{args.eagle_steps} loss {loss.item():.3f} (reg {reg.item():.3f} cls {cls.item():.3f})")
        checkpoint(args, state, "eagle_running", draft, opt, step, spent + time.time() - began)
    state.pop("eagle_running", None)
    state["eagle_seconds"] = spent + time.time() - began
    return draft.eval()


# ------------------------------------------------------------------- offline acceptance (AL)


@torch.no_grad()
def reference_runs(model, tokenizer, count: int, new_tokens: int):
    """Held-out ``code`` prompts with the target's greedy continuation and hidden states.

    One batch: every prompt is cut from the left to the shortest one's length (no padding), so
    the continuations are those of slightly shorter prompts; fine for comparing speculators.
    """
    encoded = [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in code_prompts(count, seed=0)]
    cut = min(len(r) for r in encoded)
    ids = torch.tensor([r[len(r) - cut:] for r in encoded], dtype=torch.int64)
    seqs = greedy_continue(model, ids, new_tokens)
    hidden = model.model(input_ids=seqs).last_hidden_state
    return [(seqs[i], hidden[i], cut) for i in range(len(encoded))]


def accepted(proposals: list[int], truth: torch.Tensor) -> int:
    n = 0
    for tok, ref in zip(proposals, truth.tolist()):
        if tok != ref:
            break
        n += 1
    return n


def simulate(runs, propose, k: int) -> dict:
    """Mean accepted length per verify step (bonus included) and per-position acceptance.

    ``propose(run, p, k)``: proposals for the tokens after ``seq[p+1]``, given that the target's
    hidden states are known up to row ``p`` (the bonus token ``seq[p+1]`` comes from row ``p``).
    """
    steps, tokens, reached, hits = 0, 0, [0] * k, [0] * k
    for seq, hidden, prompt_len in runs:
        p, end = prompt_len - 1, len(seq) - 1
        while p < end:
            budget = min(k, end - p - 1)
            a = accepted(propose((seq, hidden, prompt_len), p, budget)[:budget], seq[p + 2:p + 2 + budget])
            for i in range(budget):
                reached[i] += 1
                hits[i] += i < a
            steps += 1
            tokens += 1 + a
            p += 1 + a
    return {"k": k, "AL": round(tokens / steps, 3), "steps": steps,
            "per_position": [round(h / r, 3) if r else None for h, r in zip(hits, reached)]}


def head_proposer(model, heads):
    def propose(run, p, k):
        h = run[1][p]
        return [int(model.lm_head(head(h)).argmax()) for head in list(heads)[:k]]
    return propose


def eagle_proposer(model, draft, window: int = 48):
    """Drafts on the last ``window`` positions only (no KV cache here; keeps the eval cheap)."""
    def propose(run, p, k):
        seq, hidden, _ = run
        lo = max(0, p + 1 - window)
        tokens, feats = seq[lo + 1:p + 2].clone(), hidden[lo:p + 1].clone()
        out = []
        for _ in range(k):
            pred = draft(model.model.embed_tokens(tokens)[None], feats[None])[0, -1]
            tok = int(model.lm_head(pred).argmax())
            out.append(tok)
            tokens = torch.cat([tokens, torch.tensor([tok])])
            feats = torch.cat([feats, pred[None]])
        return out
    return propose


def spec_heads(state: dict, hidden_size: int, num_heads: int, layers: int = 1):
    heads = spec.build_projections(hidden_size, num_heads, layers)
    heads.load_state_dict({k.removeprefix("projections."): v for k, v in state.items()})
    return heads.eval()


def spec_eagle(state: dict, config):
    draft = spec.EagleDraft(spec.eagle_layer_config(config, state["layers.0.mlp.up_proj.weight"].shape[0]))
    draft.load_state_dict(state, strict=False)
    return draft.eval()


@torch.no_grad()
def head_hits(model, heads, runs) -> list[dict]:
    """Per head, how often the target's token ``i`` places after the next one is its top-1 and
    within its top-5, over every generated position of the eval runs (no chaining: what limits
    a head itself, and what a top-k tree could gain)."""
    out = []
    for i, head in enumerate(heads, start=1):
        top1 = top5 = n = 0
        for seq, hidden, prompt_len in runs:
            rows = range(prompt_len - 1, len(seq) - 1 - i)
            if not len(rows):
                continue
            logits = model.lm_head(head(hidden[list(rows)]))
            truth = seq[[t + 1 + i for t in rows]]
            best = logits.topk(5, dim=-1).indices
            top1 += int((best[:, 0] == truth).sum())
            top5 += int((best == truth[:, None]).any(-1).sum())
            n += len(rows)
        out.append({"head": i, "top1": round(top1 / n, 3), "top5": round(top5 / n, 3), "positions": n})
    return out


@torch.no_grad()
def eagle_teacher_forced(model, draft, runs) -> dict:
    """Top-1 agreement of the layer with the target when fed the target's *true* features over
    the whole context (the first draft token's situation, without the 48-position window),
    against the same after one step on its own predicted features (the second token's)."""
    first = second = n1 = n2 = 0
    for seq, hidden, prompt_len in runs:
        pred = draft(model.model.embed_tokens(seq[1:])[None], hidden[:-1][None])[0]  # row t -> f_{t+1}
        target = model.lm_head(hidden[1:]).argmax(-1)
        guess = model.lm_head(pred).argmax(-1)
        gen = slice(prompt_len - 1, None)
        first += int((guess[gen] == target[gen]).sum())
        n1 += len(target[gen])
        # row t' = t+1 fed the predicted f_{t'}; the true features before it stay as context
        pred2 = draft(model.model.embed_tokens(seq[2:])[None], pred[:-1][None])[0]
        guess2 = model.lm_head(pred2).argmax(-1)
        first_ok = guess[:-1] == target[:-1]
        ok2 = (guess2 == target[1:])[prompt_len - 1:] & first_ok[prompt_len - 1:]
        second += int(ok2.sum())
        n2 += int(first_ok[prompt_len - 1:].sum())
    return {"first_top1": round(first / n1, 3), "second_top1_given_first": round(second / max(n2, 1), 3),
            "note": "second: every earlier feature predicted too (harsher than drafting, where only the drafted ones are)"}


# ------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=zoo_path("tinycode-target"),
                        help="where the speculator files go (default: the embedded target)")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "train_heads",
                        help="data cache and checkpoint directory")
    parser.add_argument("--resume", action="store_true", help="continue from WORK/checkpoint.pt")
    parser.add_argument("--only", choices=["heads", "eagle"], help="train one of the two")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-layers", type=int, default=1,
                        help="residual blocks per head (turbo_num_layers); above 1 the blocks have their own weights, "
                             "which QEfficient 1.22 does not read that way (it repeats one shared block), so the "
                             "shipped heads use 1")
    parser.add_argument("--head-steps", type=int, default=1500)
    parser.add_argument("--head-batch", type=int, default=256)
    parser.add_argument("--head-lr", type=float, default=3e-3)
    parser.add_argument("--eagle-steps", type=int, default=EAGLE_STEPS)
    parser.add_argument("--eagle-batch", type=int, default=8)
    parser.add_argument("--eagle-window", type=int, default=160,
                        help="train on the last this many tokens of each row (its end is the generated part)")
    parser.add_argument("--eagle-lr", type=float, default=3e-3)
    parser.add_argument("--eagle-cls-weight", type=float, default=1.0,
                        help="weight of the soft cross-entropy beside the feature regression (EAGLE-1: 0.1)")
    parser.add_argument("--eagle-unroll", type=float, default=EAGLE_UNROLL,
                        help="weight of a second pass on the layer's own predicted features (0 = off)")
    parser.add_argument("--eagle-intermediate", type=int, default=None,
                        help="MLP width of the EAGLE layer (default: the target's)")
    parser.add_argument("--eval-prompts", type=int, default=8)
    parser.add_argument("--eval-k", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: leaves the machine's other cores to others)")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="save WORK/checkpoint.pt every this many steps")
    parser.add_argument("--minutes", type=float, default=0.0, help="pause (checkpoint) after this long; 0 = no limit")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    torch.manual_seed(args.seed)
    began = time.time()
    args.deadline = began + 60 * args.minutes if args.minutes else 0.0
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    target_dir = zoo_path("tinycode-target")
    model = AutoModelForCausalLM.from_pretrained(target_dir, local_files_only=True).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)

    ckpt = args.work / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=False) if args.resume and ckpt.is_file() else {}
    state.setdefault("load_average", []).append(round(os.getloadavg()[0], 1))
    data_file = args.work / "data.pt"
    if args.resume and data_file.is_file():
        data = torch.load(data_file)
    else:
        prompts = training_prompts(args.prompts, args.seed)
        log(f"{len(prompts)} training-split prompts; continuing each by {args.new_tokens} greedy tokens")
        data = build_data(model, tokenizer, prompts, args.new_tokens, batch=64)
        save_atomic(data, data_file)
        state["data_minutes"] = (time.time() - began) / 60
    eval_file = args.work / "eval.pt"
    if args.resume and eval_file.is_file():
        runs = torch.load(eval_file)
    else:
        runs = reference_runs(model, tokenizer, args.eval_prompts, args.new_tokens)
        save_atomic(runs, eval_file)
    common = {"target": "spdflow:tinycode-target", "prompts": args.prompts, "new_tokens": args.new_tokens,
              "positions": sum(g["tokens"].shape[0] * (g["tokens"].shape[1] - g["prompt_len"]) for g in data["groups"]),
              "data": "greedy continuations (by the target) of function openings from the training split",
              "seed": args.seed, "threads": args.threads, "torch": torch.__version__,
              "data_minutes": round(state.get("data_minutes", 0.0), 2),
              "eval": f"{args.eval_prompts} held-out code prompts (seed 0, cut from the left to the shortest), "
                      f"greedy, {args.new_tokens} new tokens"}

    try:
        if args.only in (None, "heads") and "heads_done" not in state:
            heads = train_heads(model, data, args, state)
            evaluated = time.time()
            evaluation = [simulate(runs, head_proposer(model, heads), k) for k in sorted({1, args.heads})]
            state["heads_done"] = {"state": spec.projection_state(heads), "eval": evaluation,
                                   "train_minutes": state["heads_seconds"] / 60,
                                   "eval_minutes": (time.time() - evaluated) / 60}
            save_atomic(state, ckpt)
        if args.only in (None, "eagle") and "eagle_done" not in state:
            draft = train_eagle(model, data, args, state)
            evaluated = time.time()
            evaluation = [simulate(runs, eagle_proposer(model, draft), k) for k in sorted({1, args.eval_k})]
            state["eagle_done"] = {"state": draft.state(), "eval": evaluation, "config": spec.eagle_config_json(draft.config),
                                   "train_minutes": state["eagle_seconds"] / 60,
                                   "eval_minutes": (time.time() - evaluated) / 60}
            save_atomic(state, ckpt)
    except TimeoutError:
        log(f"paused after {args.minutes} minutes; continue with --resume")
        return 0

    from safetensors.torch import save_file

    baseline = simulate(runs, lambda run, p, k: [], 1)  # no proposals: AL is exactly 1
    if "heads_done" in state:
        done = state["heads_done"]
        save_file(done["state"], str(args.out / spec.SPECULATOR_WEIGHTS))
        write_json(args.out / spec.SPECULATOR_CONFIG,
                   {"model_type": "turbo", "turbo_num_heads": args.heads, "turbo_num_layers": args.head_layers})
        write_json(args.out / "speculator_training.json", {
            **common, "kind": "multi-projection heads (Medusa-1, QEfficient turbo layout)",
            "heads": args.heads, "layers_per_head": args.head_layers, "steps": args.head_steps, "batch": args.head_batch,
            "lr_max": args.head_lr, "lr_schedule": LR_SCHEDULE,
            "train_minutes": round(done["train_minutes"], 2), "eval_minutes": round(done["eval_minutes"], 2),
            "load_average_at_starts": state["load_average"],
            "log": state.get("heads_log", []), "offline_acceptance": done["eval"], "baseline_AL": baseline["AL"],
            "head_hits": head_hits(model, spec_heads(done["state"], model.config.hidden_size, args.heads, args.head_layers), runs)})
    if "eagle_done" in state:
        done = state["eagle_done"]
        save_file(done["state"], str(args.out / spec.EAGLE_WEIGHTS))
        write_json(args.out / spec.EAGLE_CONFIG, done["config"])
        write_json(args.out / "eagle_training.json", {
            **common, "kind": "EAGLE-1-style draft layer (fc + one decoder layer, no input norm)",
            "steps": args.eagle_steps, "batch_sequences": args.eagle_batch, "window": args.eagle_window, "lr_max": args.eagle_lr,
            "lr_schedule": LR_SCHEDULE, "cls_weight": args.eagle_cls_weight, "unroll": args.eagle_unroll,
            "loss": "smooth_l1(feature) + cls_weight * soft cross-entropy to the target's next-token distribution"
                    + (", plus unroll * the same on a second pass fed the layer's own predicted features" if args.eagle_unroll else ""),
            "feature_noise": "uniform +-0.1",
            "train_minutes": round(done["train_minutes"], 2), "eval_minutes": round(done["eval_minutes"], 2),
            "load_average_at_starts": state["load_average"],
            "eval_note": "offline drafts attend to the last 48 positions only (no KV cache in the tool); the engine runs the real thing",
            "log": state.get("eagle_log", []), "offline_acceptance": done["eval"],
            "teacher_forced": eagle_teacher_forced(model, spec_eagle(done["state"], model.config), runs)})
    log(f"done in {(time.time() - began) / 60:.1f} minutes; files in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
