"""Preflight: everything about a recipe that can be checked before any export, as located findings.

One function, :func:`preflight`, serves ``spdflow lint``, ``spdflow run --dry-run`` and
``spdflow run`` (which stops before exporting when it reports an error), so the three can
never disagree. It checks what the schema cannot see because it depends on files and this
machine:

* SPD111 the target model and any model a proposer declares (a draft, ``proposer.with.model``) exist:
  a local directory with ``config.json``, an embedded model, or a hub id in the local HF cache;
* SPD107 ``workload.file`` exists, is readable, is UTF-8 text and parses (``.jsonl``);
* SPD108 ``workload.count`` asks for more prompts than the file or inline list has;
* SPD109 every prompt is non-empty and fits ctx_len, tokenized with the target's own
  tokenizer — exactly the rule generation enforces (``spdflow.engine.generate.prompt_problem``);
  SPD110 (a note) says when no tokenizer is on this machine, so lengths were not checked;
* SPD121-SPD123 the backend's compute context lengths fit ctx_len and prefill_seq_len;
* SPD105 the shapes the K policy will ask for are compiled, SPD104 the backend can run here
  (a warning; ``run`` makes it an error unless ``--compile-only``).

Imports stay light (no torch, transformers or onnxruntime): lint runs in CI. Plugins and other
modules add checks by appending to :data:`CHECKS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from spdflow.errors import SpdflowError
from spdflow.recipe.paths import ALLOW_FLAG, outside_recipe
from spdflow.recipe.loader import LoadedRecipe
from spdflow.recipe.yamlsource import Finding


@dataclass
class PreflightContext:
    """What the checks share: the recipe, the plugin manager, and facts found on the way."""

    loaded: LoadedRecipe
    pm: object
    model_dirs: dict[str, Path | None] = field(default_factory=dict)

    def model_dir(self, model_id: str, revision: str | None = None) -> Path | None:
        """The model's local directory, or None when it is not on this machine (cached)."""
        from spdflow.models import locate_model

        if model_id not in self.model_dirs:
            try:
                self.model_dirs[model_id] = locate_model(model_id, self.loaded.base_dir, revision,
                                                              allow_outside=True)  # SPD112 reports where it is
            except SpdflowError:
                self.model_dirs[model_id] = None
        return self.model_dirs[model_id]

    def finding(self, path: tuple, code: str, message: str, hint: str | None = None, severity: str = "error") -> Finding:
        return Finding(self.loaded.document.location(path), code, message, hint, severity=severity)


# ------------------------------------------------------------------------------- models


def proposer_model_ids(loaded: LoadedRecipe) -> list[tuple[str, tuple]]:
    """Models the proposer declares (``auxiliary_models()`` of its config, e.g. draft_model's
    draft): ``[(model id, recipe key path)]``, the path being the ``with:`` key that holds the id."""
    from spdflow.api import auxiliary_models

    config = loaded.proposer_config
    if config is None:
        return []
    written = loaded.recipe.proposer.with_ if loaded.recipe.proposer is not None else {}
    found = []
    for aux in auxiliary_models(config):
        if aux.model_id is None:  # built from the target's own directory (an EAGLE layer)
            continue
        key = next((k for k, v in written.items() if v == aux.model_id), None)
        found.append((aux.model_id, ("proposer", "with", key) if key else ("proposer", "with")))
    return found


def check_models(ctx: PreflightContext) -> list[Finding]:
    """SPD111: the target model and a proposer's model are on this machine (spdflow never downloads)."""
    from spdflow.models import locate_model

    recipe = ctx.loaded.recipe
    wanted = [(("model", "id"), "model.id", recipe.model.id, recipe.model.revision)]
    wanted += [(path, ".".join(path), model_id, None) for model_id, path in proposer_model_ids(ctx.loaded)]
    findings = []
    for path, key, model_id, revision in wanted:
        try:
            ctx.model_dirs[model_id] = locate_model(model_id, ctx.loaded.base_dir, revision, key=key,
                                                         allow_outside=True)  # SPD112 reports where it is
        except SpdflowError as exc:
            ctx.model_dirs[model_id] = None
            findings.append(ctx.finding(path, "SPD111", exc.message, exc.hint))
    return findings


# ------------------------------------------------------------------------------- prompts


@dataclass
class PromptSource:
    """The prompts of a workload with where each one is written, for located findings."""

    prompts: list[str]
    where: list[str]  # per prompt: "prompt 3" / "line 7 of prompts.txt"
    path: tuple  # the recipe key findings point at
    available: int | None  # distinct prompts in the source (None: a built-in set repeats as needed)


def read_prompt_source(ctx: PreflightContext) -> tuple[PromptSource | None, list[Finding]]:
    """The workload's prompts as the run would take them; findings when they cannot be read."""
    from spdflow.workload import read_prompt_file_lines

    workload = ctx.loaded.recipe.workload
    if workload.prompts is not None:
        prompts = list(workload.prompts)
        return PromptSource(prompts[: workload.count], [f"prompt {i}" for i in range(len(prompts))][: workload.count],
                            ("workload", "prompts"), len(prompts)), []
    if workload.file is not None:
        path = ctx.loaded.base_dir / workload.file
        if outside_recipe(path, ctx.loaded.base_dir) is not None and not ctx.loaded.allow_outside_paths:
            return None, []  # never read: SPD112 reports it
        try:
            lines = read_prompt_file_lines(path)
        except SpdflowError as exc:
            return None, [ctx.finding(("workload", "file"), "SPD107", exc.message, exc.hint)]
        taken = lines[: workload.count]
        return PromptSource([text for _, text in taken], [f"line {n} of {Path(workload.file).name}" for n, _ in taken],
                            ("workload", "file"), len(lines)), []
    registration = ctx.pm.registry()["workload"].get(workload.builtin)
    if registration is None:
        return None, []  # an unknown name is already a schema finding (SPD024)
    try:
        prompts = list(registration.factory(workload.count, workload.seed))[: workload.count]
    except Exception as exc:
        return None, [ctx.finding(("workload", "builtin"), "SPD107",
                                  f"the built-in workload '{workload.builtin}' cannot produce prompts: {exc}")]
    return PromptSource(prompts, [f"prompt {i}" for i in range(len(prompts))], ("workload", "builtin"), None), []


def check_prompts(ctx: PreflightContext) -> list[Finding]:
    """SPD107/SPD108/SPD109/SPD110: prompts readable, as many as asked for, each fits ctx_len."""
    from spdflow.engine.generate import prompt_problem

    source, findings = read_prompt_source(ctx)
    if source is None:
        return findings
    workload = ctx.loaded.recipe.workload
    if not source.prompts:
        return findings + [ctx.finding(source.path, "SPD107", f"workload.{source.path[-1]} holds no prompts",
                                       "give at least one non-empty prompt")]
    if source.available is not None and workload.count > source.available and _count_is_set(ctx):
        findings.append(ctx.finding(("workload", "count"), "SPD108",
                                    f"workload.count is {workload.count} but workload.{source.path[-1]} has "
                                    f"{source.available} prompt{'s' if source.available != 1 else ''}; the run uses "
                                    f"{source.available}", "lower workload.count or add prompts", severity="warning"))
    tokenizer, why_not = _target_tokenizer(ctx)
    if tokenizer is None and why_not is None:
        return findings  # the model is missing: SPD111 says so
    if tokenizer is None:
        findings.append(ctx.finding(source.path, "SPD110", f"prompt lengths not checked against ctx_len: {why_not}",
                                    "they are checked when the run starts, before generation", severity="info"))
        return findings
    from spdflow.chat import PromptRenderer, chat_setting

    recipe = ctx.loaded.recipe
    renderer = PromptRenderer(tokenizer, ctx.model_dir(recipe.model.id, recipe.model.revision),
                              chat_setting(workload, ctx.pm), f"model '{recipe.model.id}'")
    try:
        renderer.check(source.prompts)
        lengths = [len(renderer.render(p).ids) for p in source.prompts]
    except SpdflowError as exc:
        return findings + [ctx.finding(source.path, "SPD109", exc.message, exc.hint)]
    ctx_len = recipe.specialization.ctx_len
    for index, (length, where) in enumerate(zip(lengths, source.where)):
        problem = prompt_problem(index, length, ctx_len)
        if problem is not None:
            message, hint = problem
            path = source.path + (index,) if source.path == ("workload", "prompts") else source.path
            findings.append(ctx.finding(path, "SPD109", message.replace(f"prompt {index}", where, 1), hint))
    return findings


def _count_is_set(ctx: PreflightContext) -> bool:
    data = ctx.loaded.document.data
    return isinstance(data.get("workload"), dict) and "count" in data["workload"]


def _target_tokenizer(ctx: PreflightContext):
    """The target's fast tokenizer from its local folder, or (None, why not)."""
    recipe = ctx.loaded.recipe
    model_dir = ctx.model_dir(recipe.model.id, recipe.model.revision)
    if model_dir is None:
        return None, None
    if model_dir.is_file():  # a GGUF file: its tokenizer is read when the run converts it
        return None, f"the tokenizer is inside the GGUF file '{model_dir.name}' (read when the run converts it)"
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        return None, f"no tokenizer.json in '{model_dir}'"
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(tokenizer_file)), ""
    except ImportError:
        return None, "the 'tokenizers' package is not installed"
    except Exception as exc:
        return None, f"cannot read '{tokenizer_file}' ({type(exc).__name__}: {exc})"


# ------------------------------------------------------------------------------- shapes and backend


def check_shape_coverage(ctx: PreflightContext) -> list[Finding]:
    """SPD105: the K policy only asks for compiled shapes (the rule lives with the lint rules)."""
    from spdflow.lint import rule_shape_coverage

    return rule_shape_coverage(ctx.loaded, ctx.pm)


def check_compute_context_lengths(ctx: PreflightContext) -> list[Finding]:
    """SPD121-SPD123: the backend's compute context lengths fit ctx_len and prefill_seq_len."""
    from spdflow.lint import rule_compute_context_lengths

    return rule_compute_context_lengths(ctx.loaded, ctx.pm)


def check_backend(ctx: PreflightContext) -> list[Finding]:
    """SPD104: the backend can run here (a warning: lint and --compile-only do not need it)."""
    from spdflow.lint import rule_backend_available

    return rule_backend_available(ctx.loaded, ctx.pm)


def check_paths(ctx: PreflightContext) -> list[Finding]:
    """SPD112 (warning): a local path of the recipe resolves outside the recipe's folder.

    ``spdflow run`` refuses such a recipe unless ``--allow-outside-paths``; lint warns so a
    reviewer sees a recipe that would read files from elsewhere (e.g. secrets in CI)."""
    from spdflow import zoo
    from spdflow.models import PKG_PREFIX, is_gguf

    recipe, base = ctx.loaded.recipe, ctx.loaded.base_dir
    named = [(("model", "id"), "model.id", recipe.model.id)]
    named += [(("proposer", "with", "model"), "proposer.with.model", model_id)
              for model_id, _ in proposer_model_ids(ctx.loaded)]
    named = [(path, key, value, True) for path, key, value in named]
    if recipe.workload.file is not None:
        named.append((("workload", "file"), "workload.file", str(recipe.workload.file), False))
    findings = []
    for path, key, value, is_model in named:
        local = base / Path(value).expanduser()
        if is_model and (value.startswith((zoo.PREFIX, PKG_PREFIX)) or not (local.is_dir() or is_gguf(local))):
            continue  # embedded, installed in a package, or a hub id in the local HF cache: not a path of the recipe
        outside = outside_recipe(base / Path(value).expanduser(), base)
        if outside is not None:
            findings.append(ctx.finding(path, "SPD112", f"{key} '{value}' resolves to '{outside}', outside the recipe's folder",
                                        f"spdflow run refuses it unless {ALLOW_FLAG}; keep the files a recipe reads "
                                        "inside its folder", severity="warning"))
    return findings


CHECKS: list[Callable[[PreflightContext], list[Finding]]] = [
    check_paths,
    check_models,
    check_prompts,
    check_compute_context_lengths,
    check_shape_coverage,
    check_backend,
]


def preflight(loaded: LoadedRecipe, pm) -> list[Finding]:
    """Every check that needs no export, in a stable order; ``loaded`` must be a valid recipe."""
    if loaded.recipe is None or loaded.document is None:
        return []
    ctx = PreflightContext(loaded, pm)
    findings: list[Finding] = []
    for check in CHECKS:
        findings += check(ctx)
    return findings


def run_blockers(findings: list[Finding], *, compile_only: bool) -> list[Finding]:
    """The findings that stop ``spdflow run``: errors, and the backend warning unless --compile-only."""
    return [f for f in findings if f.severity == "error" or (f.code == "SPD104" and not compile_only)]
