"""``spdflow lint``: schema errors plus semantic rules with stable codes.

Codes: SPD0xx make a recipe invalid (schema, YAML, cross-field checks; exit 3);
SPD1xx are lint rules (errors exit 1; warnings exit 0 unless --strict).
This module must not import torch, transformers or onnxruntime: lint runs in CI.
"""
from __future__ import annotations

import glob
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from spdflow.recipe.loader import LoadedRecipe, read_recipe
from spdflow.recipe.yamlsource import Finding, Location

RECIPE_SUFFIXES = (".yaml", ".yml")


def rule_k_list_sorted(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD101: an unsorted K-list works (it is sorted) but reads like a mistake."""
    ks = loaded.recipe.num_speculative_tokens
    if ks == sorted(ks):
        return []
    return [_warn(loaded, ("num_speculative_tokens",), "SPD101", f"the K-list {ks} is not sorted; it is compiled as {sorted(set(ks))}",
                  "write it sorted")]


def rule_k_list_unique(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD102: duplicate K values compile once."""
    ks = loaded.recipe.num_speculative_tokens
    dupes = sorted({k for k in ks if ks.count(k) > 1})
    if not dupes:
        return []
    return [_warn(loaded, ("num_speculative_tokens",), "SPD102", f"K {', '.join(map(str, dupes))} is listed more than once",
                  "list each K once")]


def rule_k0_when_proposer_may_be_empty(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD103: without K=0, steps with no proposal still pay for the smallest K."""
    recipe = loaded.recipe
    if recipe.proposer is None or 0 in recipe.k_list() or recipe.k_policy not in ("smallest_covering", "goodput"):
        return []
    registration = pm.registry()["proposer"].get(recipe.proposer.uses)
    if registration is None or not getattr(registration.factory, "may_propose_nothing", True):
        return []
    return [_warn(loaded, ("num_speculative_tokens",), "SPD103",
                  f"proposer '{recipe.proposer.uses}' may propose nothing, but K=0 is not compiled: such steps verify "
                  f"K={min(recipe.k_list())} padding slots", "add 0 to num_speculative_tokens, e.g. [0, 4]")]


def rule_backend_available(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD104: the backend is installed but cannot run on this machine (e.g. no QAIC SDK in CI)."""
    registration = pm.registry()["backend"].get(loaded.recipe.devices.backend)
    if registration is None:
        return []
    try:
        reason = registration.factory().unavailable_reason()
    except Exception as exc:  # a lint must not fail because a backend probe did
        reason = f"its availability check failed ({type(exc).__name__}: {exc})"
    if not reason:
        return []
    return [_warn(loaded, ("devices", "backend"), "SPD104", f"backend '{loaded.recipe.devices.backend}' cannot run here: {reason}",
                  "fine for lint and --compile-only; run on a machine with the runtime")]


def rule_shape_coverage(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD105: every shape the runtime will ask for must be among the specializations."""
    recipe = loaded.recipe
    spec = recipe.specialization
    shapes = pm.hook.spdflow_specialize(
        num_speculative_tokens=recipe.k_list(), prefill_seq_len=spec.prefill_seq_len, ctx_len=spec.ctx_len,
        batch_size=spec.batch_size, full_batch_size=spec.full_batch_size,
    )
    compiled = {(s.kind, s.seq_len, s.num_logits_to_keep) for s in shapes or []}
    needed = {("prefill", spec.prefill_seq_len, 1)}
    ks = recipe.k_list()
    wanted = {"nospec": [0], "fixed": [max(ks)]}.get(recipe.k_policy, ks)
    needed |= {("decode", k + 1, k + 1) for k in wanted}
    missing = sorted(needed - compiled)
    if not missing:
        return []
    text = ", ".join(f"{kind} seq_len={s}" for kind, s, _ in missing)
    return [Finding(loaded.document.location(("num_speculative_tokens",)), "SPD105",
                    f"k_policy '{recipe.k_policy}' needs shapes that are not compiled: {text}",
                    "add the missing K to num_speculative_tokens (nospec needs 0)")]


def rule_fixed_policy_wastes_shapes(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD106: the fixed policy only ever runs the largest K."""
    ks = loaded.recipe.k_list()
    if loaded.recipe.k_policy != "fixed" or len(ks) == 1:
        return []
    return [_warn(loaded, ("k_policy",), "SPD106", f"k_policy 'fixed' only runs K={max(ks)}; the other shapes of {ks} are compiled for nothing",
                  f"set num_speculative_tokens: {max(ks)} or use k_policy: smallest_covering")]


RULES: tuple[Callable[[LoadedRecipe, object], list[Finding]], ...] = (
    rule_k_list_sorted,
    rule_k_list_unique,
    rule_k0_when_proposer_may_be_empty,
    rule_backend_available,
    rule_shape_coverage,
    rule_fixed_policy_wastes_shapes,
)


def _warn(loaded: LoadedRecipe, path: tuple, code: str, message: str, hint: str) -> Finding:
    return Finding(loaded.document.location(path), code, message, hint, severity="warning")


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    invalid: bool = False

    def exit_code(self, strict: bool) -> int:
        if self.invalid:
            return 3
        if any(f.severity == "error" for f in self.findings):
            return 1
        if strict and self.findings:
            return 1
        return 0


def expand_paths(patterns: list[str]) -> list[Path]:
    """Files, directories (their *.yaml/*.yml) and globs, in a stable order, deduplicated."""
    found: list[Path] = []
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.suffix in RECIPE_SUFFIXES and p.is_file())
        elif any(ch in pattern for ch in "*?["):
            found += sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        else:
            found.append(path)
    unique: dict[str, Path] = {}
    for path in found:
        unique.setdefault(str(path), path)
    return list(unique.values())


def lint_paths(patterns: list[str], pm, overrides: list[str] | None = None) -> LintResult:
    """Lint every recipe the patterns name; findings of all files, in file order."""
    result = LintResult()
    files = expand_paths(patterns)
    if not files:
        result.invalid = True
        result.findings.append(Finding(Location(" ".join(patterns) or "."), "SPD000", "no recipe files found",
                                       "pass .yaml files, directories or globs"))
        return result
    for path in files:
        result.files.append(path)
        loaded = read_recipe(path, pm, overrides)
        if loaded.errors:
            result.invalid = True
            result.findings += loaded.findings
            continue
        result.findings += loaded.findings
        for rule in RULES:
            result.findings += rule(loaded, pm)
    return result


def render(result: LintResult, fmt: str) -> str:
    """The findings as text (flake8-like), json, or GitHub workflow commands."""
    if fmt == "json":
        return json.dumps({"files": [str(p) for p in result.files],
                           "findings": [f.as_dict() for f in result.findings]}, indent=2)
    if fmt == "github":
        lines = []
        for f in result.findings:
            level = "error" if f.severity == "error" else "warning"
            message = f.message + (f" (hint: {f.hint})" if f.hint else "")
            message = message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
            lines.append(f"::{level} file={f.location.source},line={f.location.line},col={f.location.col},title={f.code}::{message}")
        return "\n".join(lines)
    lines = [f.render() if f.severity == "error" else f.render().replace(f" {f.code} ", f" {f.code} warning: ", 1)
             for f in result.findings]
    errors = sum(f.severity == "error" for f in result.findings)
    warnings = len(result.findings) - errors
    lines.append(f"{len(result.files)} file(s) checked: {errors} error(s), {warnings} warning(s)")
    return "\n".join(lines)
