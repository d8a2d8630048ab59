"""``spdflow lint``: schema errors plus semantic rules with stable codes.

Codes: SPD0xx make a recipe invalid (schema, YAML, cross-field checks; exit 3);
SPD1xx are lint rules (errors exit 1; warnings exit 0 unless --strict).
This module must not import torch, transformers or onnxruntime: lint runs in CI.
"""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from spdflow.plugins import required_ks
from spdflow.preflight import preflight
from spdflow.recipe.loader import LoadedRecipe, read_recipe, read_regular_text
from spdflow.recipe.yamlsource import MAX_BYTES
from spdflow.recipe.yamlsource import Finding, Location
from spdflow.sweep.spec import is_sweep_document, read_sweep

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
    if recipe.proposer is None or 0 in recipe.k_list():
        return []
    policy = _policy(loaded, pm)
    with_zero = required_ks(policy, [0, *recipe.k_list()]) if policy is not None else []
    if 0 not in with_zero or len(with_zero) < 2:  # the policy would not pick K = 0 for such steps
        return []
    registration = pm.registry()["proposer"].get(recipe.proposer.uses)
    if registration is None or not getattr(registration.factory, "may_propose_nothing", True):
        return []
    return [_warn(loaded, ("num_speculative_tokens",), "SPD103",
                  f"proposer '{recipe.proposer.uses}' may propose nothing, but K=0 is not compiled: such steps verify "
                  f"K={min(recipe.k_list())} padding slots", "add 0 to num_speculative_tokens, e.g. [0, 4]")]


def _policy(loaded: LoadedRecipe, pm):
    """The recipe's K policy, built from its settings as a run builds it (None if it cannot be)."""
    from spdflow.plugins import make_k_policy

    try:
        return make_k_policy(pm, loaded.recipe.k_policy.uses, loaded.recipe.k_policy.with_)
    except Exception:  # an unknown or broken policy is reported elsewhere
        return None


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
    try:
        shapes = pm.hook.spdflow_specialize(
            num_speculative_tokens=recipe.k_list(), prefill_seq_len=spec.prefill_seq_len, ctx_len=spec.ctx_len,
            batch_size=spec.batch_size, full_batch_size=spec.full_batch_size,
            **_ccl_settings(loaded, pm),
        )
    except ValueError:  # out-of-range shape settings are the recipe checks' and SPD121/SPD123's to report
        return []
    compiled = {(s.kind, s.seq_len, s.num_logits_to_keep) for s in shapes or []}
    needed = {("prefill", spec.prefill_seq_len, 1)}
    ks = recipe.k_list()
    policy = _policy(loaded, pm)
    wanted = required_ks(policy, ks) if policy is not None else ks
    needed |= {("decode", k + 1, k + 1) for k in wanted}
    missing = sorted(needed - compiled)
    if not missing:
        return []
    text = ", ".join(f"{kind} seq_len={s}" for kind, s, _ in missing)
    return [Finding(loaded.document.location(("num_speculative_tokens",)), "SPD105",
                    f"k_policy '{recipe.k_policy.uses}' needs shapes that are not compiled: {text}",
                    "add the missing K to num_speculative_tokens (nospec needs 0)")]


def rule_policy_wastes_shapes(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD106: a policy that only runs some of the K-list (e.g. fixed: the largest) wastes the rest."""
    ks = loaded.recipe.k_list()
    policy = _policy(loaded, pm)
    if policy is None:
        return []
    used = sorted(set(required_ks(policy, ks)) & set(ks))
    if not used or len(used) == len(ks):
        return []
    name = loaded.recipe.k_policy.uses
    shown = used[0] if len(used) == 1 else used
    return [_warn(loaded, ("k_policy",), "SPD106", f"k_policy '{name}' only runs K={shown}; the other shapes of {ks} are compiled for nothing",
                  f"set num_speculative_tokens: {shown} or use a policy that chooses among them")]


def _ccl_settings(loaded: LoadedRecipe, pm) -> dict:
    """The backend's compute context lengths as ``spdflow_specialize`` takes them (Nones when
    the backend or its settings are unknown: the schema checks report those)."""
    from spdflow.errors import SpdflowError
    from spdflow.plugins import backend_ccl

    try:
        return backend_ccl(pm, loaded.recipe.devices)
    except SpdflowError:
        return {"comp_ctx_lengths": None, "comp_ctx_lengths_prefill": None}


def rule_compute_context_lengths(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD121-SPD123: the backend's compute context lengths (``devices.with.comp_ctx_lengths``
    and ``comp_ctx_lengths_prefill``) fit the KV cache and the prefill chunk.

    SPD121 (error) a CCL above ctx_len; SPD122 (warning) a list not ascending or with repeats (it
    is compiled sorted and deduplicated); SPD123 (error) a prefill CCL below prefill_seq_len. A
    list that does not end with ctx_len is fine: ctx_len is added, so every sequence has a CCL.
    """
    settings = _ccl_settings(loaded, pm)
    spec = loaded.recipe.specialization
    findings = []
    for name, low, code in (("comp_ctx_lengths", 1, None), ("comp_ctx_lengths_prefill", spec.prefill_seq_len, "SPD123")):
        values = settings.get(name)
        if values is None:
            continue
        key = f"devices.with.{name}"
        for i, value in enumerate(values):
            path = ("devices", "with", name, i)
            if value > spec.ctx_len:
                findings.append(Finding(loaded.document.location(path), "SPD121",
                                        f"{key} has {value}, more than ctx_len {spec.ctx_len}",
                                        f"use compute context lengths of at most {spec.ctx_len} (ctx_len is always "
                                        "compiled; leave it out or end the list with it)"))
            elif code and value < low:
                findings.append(Finding(loaded.document.location(path), code,
                                        f"{key} has {value}, less than prefill_seq_len {low}: a prefill chunk "
                                        f"reads at least {low} cache slots",
                                        f"use prefill compute context lengths of at least {low}"))
        if list(values) != sorted(set(values)):
            findings.append(_warn(loaded, ("devices", "with", name), "SPD122",
                                  f"{key} {list(values)} is not strictly ascending; it is compiled as "
                                  f"{sorted(set(values))}", "write it ascending, each length once"))
    return findings


def rule_backend_takes_dtype(loaded: LoadedRecipe, pm) -> list[Finding]:
    """SPD120: the backend cannot compile weights of model.dtype with its settings (e.g. bfloat16
    for AI 100), so the run would export a graph its compiler rejects."""
    from spdflow.errors import SpdflowError
    from spdflow.plugins import plugin_config

    recipe = loaded.recipe
    try:
        registration = pm.lookup("backend", recipe.devices.backend)
        config = plugin_config(pm, "backend", recipe.devices.backend, recipe.devices.with_)
        problem = registration.factory().dtype_problem(recipe.model.dtype, config)
    except SpdflowError:
        return []  # an unknown backend or bad settings are reported by the schema checks
    if not problem:
        return []
    return [Finding(loaded.document.location(("model", "dtype")), "SPD120",
                    f"backend '{recipe.devices.backend}' cannot compile model.dtype {recipe.model.dtype}: {problem}",
                    "set model.dtype: float32", severity="error")]


#: Rules about the recipe text alone. The checks against files and this machine (models, prompt
#: files and lengths, shape coverage SPD105, backend SPD104) are ``spdflow.preflight``'s, shared
#: with ``run`` and ``--dry-run``; lint runs both.
RULES: tuple[Callable[[LoadedRecipe, object], list[Finding]], ...] = (
    rule_k_list_sorted,
    rule_k_list_unique,
    rule_k0_when_proposer_may_be_empty,
    rule_policy_wastes_shapes,
    rule_backend_takes_dtype,
)


def _warn(loaded: LoadedRecipe, path: tuple, code: str, message: str, hint: str) -> Finding:
    return Finding(loaded.document.location(path), code, message, hint, severity="warning")


@dataclass
class LintOptions:
    """How ``lint`` picks files and findings (the command's flags)."""

    exclude: list[str] = field(default_factory=list)  # globs on the path or any of its folders
    select: list[str] = field(default_factory=list)  # codes or code prefixes to keep (all when empty)
    ignore: list[str] = field(default_factory=list)  # codes or code prefixes to drop
    recipe_globs: list[str] = field(default_factory=list)  # files that are recipes whatever their content
    recipes_only: bool = False  # also skip named files that do not look like recipes (pre-commit)
    gitignore: bool = True  # skip what git ignores when walking a directory


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    invalid: bool = False
    suppressed: int = 0  # findings dropped by noqa comments, --select or --ignore

    def exit_code(self, strict: bool) -> int:
        if self.invalid:
            return 3
        if any(f.severity == "error" for f in self.findings):
            return 1
        if strict and any(f.severity == "warning" for f in self.findings):
            return 1
        return 0


# ------------------------------------------------------------------------------- which files

#: Folders never walked when git cannot say what is ignored.
_NEVER_WALK = {"__pycache__", "node_modules", "site-packages"}


def looks_like_recipe(path: Path) -> bool:
    """A top-level ``version:`` line plus another top-level key of the recipe schema.

    Read from the raw text, so a recipe with a YAML syntax error is still recognized (and linted)."""
    from spdflow.recipe.schema import Recipe

    try:
        head = read_regular_text(path, limit=65536)
    except (OSError, UnicodeDecodeError):
        return False
    keys = set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)[ \t]*:", head, flags=re.MULTILINE))
    known = {info.alias or name for name, info in Recipe.model_fields.items()}
    return "version" in keys and bool((keys & known) - {"version"})


def _git_files(directory: Path) -> list[Path] | None:
    """Files under ``directory`` that git tracks or would track (ignored ones left out), or None
    when ``directory`` is not in a git work tree or git is missing."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(directory), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              "--", "."], capture_output=True, timeout=60, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return [directory / name for name in out.decode("utf-8", "surrogateescape").split("\0") if name]


def _gitignore_patterns(directory: Path) -> list[str]:
    try:
        lines = (directory / ".gitignore").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return [line.strip() for line in lines if line.strip() and not line.startswith(("#", "!"))]


def _walk_files(directory: Path) -> list[Path]:
    """Without git: every file, skipping hidden folders (.venv, .git), caches and the top
    .gitignore's patterns (a simple reading: name or path globs, trailing / for folders)."""
    patterns = _gitignore_patterns(directory)
    found = []
    for root, dirs, files in os.walk(directory):
        rel_root = Path(root).relative_to(directory)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NEVER_WALK
                         and not _gitignored(rel_root / d, patterns, is_dir=True))
        found += [Path(root) / f for f in sorted(files) if not _gitignored(rel_root / f, patterns, is_dir=False)]
    return found


def _gitignored(rel: Path, patterns: list[str], *, is_dir: bool) -> bool:
    for pattern in patterns:
        if pattern.endswith("/") and not is_dir:
            continue
        pattern = pattern.rstrip("/")
        if pattern.startswith("/"):
            if fnmatch.fnmatch(rel.as_posix(), pattern[1:]):
                return True
        elif fnmatch.fnmatch(rel.name, pattern) or fnmatch.fnmatch(rel.as_posix(), pattern):
            return True
    return False


def is_excluded(path: Path, patterns: list[str]) -> bool:
    """``--exclude``: a glob on the whole path (as given or relative to the current folder) or on
    any folder or file name in it."""
    if not patterns:
        return False
    forms = {path.as_posix()}
    try:
        forms.add(path.resolve().relative_to(Path.cwd().resolve()).as_posix())
    except ValueError:
        pass
    parts = {part for form in forms for part in Path(form).parts}
    return any(fnmatch.fnmatch(form, pattern.rstrip("/")) or fnmatch.fnmatch(form, pattern.rstrip("/") + "/*")
               for pattern in patterns for form in forms) or \
        any(fnmatch.fnmatch(part, pattern.rstrip("/")) for pattern in patterns for part in parts)


def _is_recipe_candidate(path: Path, options: LintOptions) -> bool:
    if any(fnmatch.fnmatch(path.as_posix(), g) or fnmatch.fnmatch(path.name, g) for g in options.recipe_globs):
        return True
    return path.suffix in RECIPE_SUFFIXES and looks_like_recipe(path)


def expand_paths(patterns: list[str], options: LintOptions | None = None) -> list[Path]:
    """Files, directories and globs, in a stable order, deduplicated.

    A directory yields the files under it that look like recipes (see ``looks_like_recipe``, or
    ``--recipe-glob``), leaving out what git ignores (.venv, runs/ ...). Files and globs named
    on the command line are linted as given unless ``recipes_only``. ``--exclude`` applies to all.
    """
    options = options or LintOptions()
    found: list[Path] = []
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            listed = _git_files(path) if options.gitignore else None
            if listed is None:
                listed = _walk_files(path)
            found += sorted(p for p in listed if p.is_file() and _is_recipe_candidate(p, options))
        else:
            if any(ch in pattern for ch in "*?["):
                named = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            else:
                named = [path]
            found += [p for p in named if not options.recipes_only or (p.is_file() and _is_recipe_candidate(p, options))]
    unique: dict[str, Path] = {}
    for path in found:
        if not is_excluded(path, options.exclude):
            unique.setdefault(str(path), path)
    return list(unique.values())


# ------------------------------------------------------------------------------- which findings

_NOQA = re.compile(r"#\s*spdflow:\s*noqa(?P<file>-file)?\b:?(?P<codes>(?:[\s,]*[A-Z]+[0-9]+)*)")


def noqa_codes(text: str) -> tuple[dict[int, set[str] | None], set[str] | None]:
    """``# spdflow: noqa SPD104`` comments: {line: codes} and the file-wide codes of
    ``# spdflow: noqa-file SPD104``; ``None`` as codes means every code."""
    per_line: dict[int, set[str] | None] = {}
    per_file: set[str] | None = set()
    for number, line in enumerate(text.splitlines(), 1):
        match = _NOQA.search(line)
        if match is None:
            continue
        codes = set(re.findall(r"[A-Z]+[0-9]+", match.group("codes"))) or None
        if match.group("file"):
            per_file = None if codes is None or per_file is None else per_file | codes
        else:
            per_line[number] = codes
    return per_line, per_file


def _matches(code: str, selectors: list[str]) -> bool:
    return any(code.startswith(s) for s in selectors)


def keep_finding(finding: Finding, options: LintOptions, noqa) -> bool:
    """False when ``--select``/``--ignore`` or a noqa comment of the finding's file drops it."""
    if options.select and not _matches(finding.code, options.select):
        return False
    if _matches(finding.code, options.ignore):
        return False
    per_line, per_file = noqa
    if per_file is None or _matches(finding.code, sorted(per_file)):
        return False
    if finding.location.line in per_line:
        codes = per_line[finding.location.line]
        return codes is not None and not _matches(finding.code, sorted(codes))
    return True


def lint_paths(patterns: list[str], pm, overrides: list[str] | None = None, options: LintOptions | None = None) -> LintResult:
    """Lint every recipe the patterns name; findings of all files, in file order."""
    options = options or LintOptions()
    result = LintResult()
    files = expand_paths(patterns, options)
    if not files:
        if not options.recipes_only:
            result.invalid = True
            result.findings.append(Finding(Location(" ".join(patterns) or "."), "SPD000", "no recipe files found",
                                           "pass .yaml files, directories or globs"))
        return result
    for path in files:
        result.files.append(path)
        loaded = read_recipe(path, pm, overrides)
        if loaded.document is not None and is_sweep_document(loaded.document.data):
            findings = read_sweep(path, pm).findings  # every point is checked there, rules and preflight included
        else:
            findings = list(loaded.findings)
            if not loaded.errors:
                for rule in RULES:
                    findings += rule(loaded, pm)
                findings += preflight(loaded, pm)
        try:
            noqa = noqa_codes(read_regular_text(path, limit=MAX_BYTES))  # never a FIFO or /dev/zero
        except (OSError, UnicodeDecodeError):
            noqa = ({}, set())
        # noqa comments speak for their own file's lines, not for --set overrides
        kept = [f for f in findings if keep_finding(f, options, noqa if f.location.source == str(path) else ({}, set()))]
        result.suppressed += len(findings) - len(kept)
        result.findings += kept
        # SPD0xx (recipe) and SPD3xx (sweep file) errors make a file invalid
        if any(f.severity == "error" and f.code.startswith(("SPD0", "SPD3")) for f in kept):
            result.invalid = True
    return result


_LABEL = {"error": "", "warning": "warning: ", "info": "note: "}


def github_escape_data(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF escaped (GitHub's workflow-command rules)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_escape_property(text: str) -> str:
    """A workflow command's property value (file=, title=): also ``:`` and ``,``."""
    return github_escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render(result: LintResult, fmt: str) -> str:
    """The findings as text (flake8-like), json, or GitHub workflow commands."""
    if fmt == "json":
        return json.dumps({"files": [str(p) for p in result.files],
                           "findings": [f.as_dict() for f in result.findings]}, indent=2)
    if fmt == "github":
        lines = []
        for f in result.findings:
            level = {"error": "error", "warning": "warning"}.get(f.severity, "notice")
            message = f.message + (f" (hint: {f.hint})" if f.hint else "")
            props = {"file": f.location.source, "line": f.location.line, "col": f.location.col, "title": f.code}
            rendered = ",".join(f"{k}={github_escape_property(str(v))}" for k, v in props.items())
            lines.append(f"::{level} {rendered}::{github_escape_data(message)}")
        return "\n".join(lines)
    lines = [f.render().replace(f" {f.code} ", f" {f.code} {_LABEL.get(f.severity, '')}", 1) for f in result.findings]
    errors = sum(f.severity == "error" for f in result.findings)
    warnings = sum(f.severity == "warning" for f in result.findings)
    notes = len(result.findings) - errors - warnings
    lines.append(f"{len(result.files)} file(s) checked: {errors} error(s), {warnings} warning(s)"
                 + (f", {notes} note(s)" if notes else ""))
    return "\n".join(lines)
