"""Cross-field rules of a recipe: each a small named function returning findings (errors).

Warnings (legal but suspicious settings) are lint rules in ``spdflow.lint``.
"""
from __future__ import annotations

from typing import Callable

from spdflow.recipe.schema import Recipe
from spdflow.recipe.yamlsource import Finding, YamlDocument


def check_prefill_covers_k(recipe: Recipe, doc: YamlDocument) -> list[Finding]:
    """A prefill chunk must hold the anchor plus the largest K proposals."""
    need = max(recipe.k_list()) + 1
    if recipe.specialization.prefill_seq_len >= need:
        return []
    return [Finding(doc.location(("specialization", "prefill_seq_len")), "SPD030",
                    f"prefill_seq_len {recipe.specialization.prefill_seq_len} is smaller than max(K)+1 = {need}",
                    f"set specialization.prefill_seq_len to at least {need} or drop the largest K")]


def check_ctx_exceeds_prefill(recipe: Recipe, doc: YamlDocument) -> list[Finding]:
    """The KV cache must be longer than one prefill chunk."""
    spec = recipe.specialization
    if spec.ctx_len > spec.prefill_seq_len:
        return []
    return [Finding(doc.location(("specialization", "ctx_len")), "SPD031",
                    f"ctx_len {spec.ctx_len} must be larger than prefill_seq_len {spec.prefill_seq_len}",
                    "raise ctx_len or lower prefill_seq_len")]


def check_full_batch_size(recipe: Recipe, doc: YamlDocument) -> list[Finding]:
    """Continuous batching needs at least as many KV slots as the prefill batch."""
    spec = recipe.specialization
    if spec.full_batch_size is None or spec.full_batch_size >= spec.batch_size:
        return []
    return [Finding(doc.location(("specialization", "full_batch_size")), "SPD032",
                    f"full_batch_size {spec.full_batch_size} is smaller than batch_size {spec.batch_size}",
                    "set full_batch_size >= batch_size")]


def check_unique_device_ids(recipe: Recipe, doc: YamlDocument) -> list[Finding]:
    """A device may appear once in a device group."""
    ids = recipe.devices.device_ids
    seen: set[int] = set()
    for i, device in enumerate(ids):
        if device in seen:
            return [Finding(doc.location(("devices", "device_ids", i)), "SPD033",
                            f"device {device} is listed twice in devices.device_ids", "list each device once")]
        seen.add(device)
    return []


def check_max_new_tokens_fits(recipe: Recipe, doc: YamlDocument) -> list[Finding]:
    """Generated tokens plus at least one prompt token must fit in the KV cache."""
    limit = recipe.specialization.ctx_len - 2
    if recipe.workload.max_new_tokens <= limit:
        return []
    return [Finding(doc.location(("workload", "max_new_tokens")), "SPD034",
                    f"max_new_tokens {recipe.workload.max_new_tokens} cannot fit in ctx_len {recipe.specialization.ctx_len}",
                    f"use at most {limit} (ctx_len - 2) or raise specialization.ctx_len")]


def check_one_prompt_source(recipe: Recipe, doc: YamlDocument) -> list[Finding]:
    """A workload takes prompts from exactly one place."""
    w = recipe.workload
    given = [name for name in ("prompts", "file", "builtin") if getattr(w, name) is not None]
    if len(given) == 1:
        if w.prompts is not None and not w.prompts:
            return [Finding(doc.location(("workload", "prompts")), "SPD035", "workload.prompts is empty",
                            "give at least one prompt")]
        return []
    message = ("the workload has no prompts" if not given
               else f"the workload gives prompts in {len(given)} ways ({', '.join(given)})")
    return [Finding(doc.location(("workload",)), "SPD035", message,
                    "set exactly one of workload.prompts, workload.file, workload.builtin")]


def check_proposer_for_k(recipe: Recipe, doc: YamlDocument) -> list[Finding]:
    """Speculation (a K > 0) needs a proposer."""
    if recipe.proposer is not None or max(recipe.k_list()) == 0:
        return []
    return [Finding(doc.location(("num_speculative_tokens",)), "SPD036",
                    f"num_speculative_tokens {recipe.k_list()} speculates but the recipe has no proposer",
                    "add a proposer (e.g. uses: prompt_lookup) or set num_speculative_tokens: 0")]


def check_lossless_acceptance(recipe: Recipe, doc: YamlDocument, pm) -> list[Finding]:
    """The acceptor must keep the output distribution at the workload's temperature, as its
    plugin declares it (``Acceptor.lossless_at``; greedy acceptance is lossless only for greedy
    decoding). Run by the loader, which has the registry; an unknown name is SPD023's."""
    from spdflow.plugins import auto_acceptor, lossless_at

    temperature = recipe.workload.temperature
    registration = pm.registry()["acceptor"].get(recipe.acceptance)
    auto = auto_acceptor(pm, temperature)
    if recipe.acceptance == "auto" and auto is None:
        return [Finding(doc.location(("acceptance",)), "SPD037",
                        f"acceptance auto finds no installed acceptor that keeps the output distribution at "
                        f"temperature {temperature}", "name an acceptor with acceptance: NAME (see `spdflow plugins`)")]
    if registration is None or lossless_at(registration, temperature) is not False:
        return []
    return [Finding(doc.location(("acceptance",)), "SPD037",
                    f"acceptance '{registration.name}' with temperature {temperature} would change the output distribution",
                    f"use acceptance: auto ({auto} at this temperature)" if auto else "use acceptance: auto")]


CHECKS: tuple[Callable[[Recipe, YamlDocument], list[Finding]], ...] = (
    check_prefill_covers_k,
    check_ctx_exceeds_prefill,
    check_full_batch_size,
    check_unique_device_ids,
    check_max_new_tokens_fits,
    check_one_prompt_source,
    check_proposer_for_k,
)


def run_checks(recipe: Recipe, doc: YamlDocument) -> list[Finding]:
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(check(recipe, doc))
    return findings
