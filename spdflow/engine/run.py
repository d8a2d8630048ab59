"""Running a recipe: plan the stages, skip what is cached, generate, and write the report.

Stages: export -> specialize -> compile -> generate -> report. Each stage records a status
(ran, cached, failed, not_run), the reason, its duration and its cache key.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from spdflow import __version__
from spdflow.api import (
    AuxiliaryModel,
    CompileRequest,
    CompiledProgram,
    ExportRequest,
    ModelInfo,
    ProposerContext,
    Request,
    RunState,
    Sampling,
    Specialization,
    StageResult,
    STAGES,
    auxiliary_models,
)
from spdflow.engine import cache
from spdflow.errors import LosslessError, PluginError, PreflightError, RunInterrupted, SpdflowError, StageError
from spdflow.files import atomic_dir
from spdflow.plugins import backend_ccl, make_k_policy, plugin_config, resolve_acceptance, speculates
from spdflow.recipe.loader import LoadedRecipe
from spdflow.recipe.schema import DevicesSpec, ModelSpec, Recipe

@dataclass
class RunOptions:
    force: bool = False
    from_stage: str | None = None
    compile_only: bool = False
    check_lossless: bool = False
    verify: bool = False  # hash every cached file in full before reusing it
    baseline: bool = False  # run no-spec first in the same process and report the speed-up
    report_path: Path | None = None
    #: where exports (and the compiled programs beside them) are kept; None keeps them in the
    #: run directory. Runs that share a cache dir reuse each other's artifacts (a sweep).
    cache_dir: Path | None = None


@dataclass
class PreparedGeneration:
    """What a generation run needs, set up once by :meth:`Engine.prepare_generation`."""

    info: ModelInfo
    tokenizer: Any
    requests: list[Request]
    session: Any
    sampling: Sampling
    config: Any  # spdflow.engine.generate.LoopConfig (imported lazily: the loop pulls numpy work)
    prompts: list = field(default_factory=list)  # as the workload gave them: text or chat messages
    chats: list[bool] = field(default_factory=list)  # per request: rendered with the chat template


@dataclass
class ProgramPlan:
    """One program a run compiles: whose (role), which model, its K-list and devices."""

    role: str
    model: ModelSpec
    k_list: list[int]
    devices: DevicesSpec
    graph: str = "causal_lm"  # what the export builds (ExportRequest.graph)


class NullUI:
    """The interface the engine reports progress through (the CLI passes a rich one)."""

    def stage(self, name: str, status: str, reason: str = "") -> None: ...
    def message(self, text: str) -> None: ...
    def warn(self, text: str) -> None: ...
    def generation(self, total_tokens: int, label: str):
        return _NullProgress()


class _NullProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def advance(self, n: int) -> None: ...


# ------------------------------------------------------------------------------- planning


def should_force(stage: str, options: RunOptions) -> bool:
    """--force reruns every stage; --from STAGE reruns that stage and those after it."""
    if options.force:
        return True
    if options.from_stage is None:
        return False
    return STAGES.index(stage) >= STAGES.index(options.from_stage)


def specializations_for(pm, recipe: Recipe, k_list: list[int] | None = None,
                        devices: DevicesSpec | None = None) -> list[Specialization]:
    """The shapes of one program: the recipe's shape settings, ``k_list`` (default: the
    recipe's) and the compute context lengths of ``devices`` (default: the recipe's)."""
    spec = recipe.specialization
    shapes = pm.hook.spdflow_specialize(
        num_speculative_tokens=k_list if k_list is not None else recipe.k_list(),
        prefill_seq_len=spec.prefill_seq_len, ctx_len=spec.ctx_len,
        batch_size=spec.batch_size, full_batch_size=spec.full_batch_size,
        **backend_ccl(pm, devices if devices is not None else recipe.devices),
    )
    if not shapes:
        raise PluginError("no plugin implements spdflow_specialize", hint="reinstall spdflow (the 'shapes' plugin)")
    return list(shapes)


def draft_devices(pm, devices: DevicesSpec, device_ids: list[int] | None, num_cores: int | None) -> DevicesSpec:
    """The target's devices section with a draft model's own device group and core count.

    ``num_cores`` goes into ``devices.with`` only for a backend whose settings have it.
    """
    update: dict[str, Any] = {}
    if device_ids is not None:
        update["device_ids"] = device_ids
    config = pm.lookup("backend", devices.backend).config
    if num_cores is not None and config is not None and "num_cores" in config.model_fields:
        update["with_"] = {**devices.with_, "num_cores": num_cores}
    return devices.model_copy(update=update)


def stage_namer(role: str) -> Callable[[str], str]:
    """Stage names of a model: ``export`` ... for the target, ``export:draft`` ... for others."""
    return (lambda base: base) if role == "target" else (lambda base: f"{base}:{role}")


def export_key(pm, model: ModelSpec, model_dir: Path, role: str, cb: bool, outputs: tuple[str, ...] = (),
               ccl: bool = False, graph: str = "causal_lm") -> str:
    impls = sorted(f"{pm.get_name(i.plugin)}" for i in pm.hook.spdflow_export.get_hookimpls())
    inputs = cache.dir_digest(model_dir, ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt"))
    config = {"dtype": model.dtype, "role": role, "continuous_batching": cb}
    if outputs:  # only then: the default graph keeps its key
        config["outputs"] = sorted(outputs)
    if ccl:  # likewise: a graph with the comp_ctx_lengths input
        config["ccl"] = True
    if graph != "causal_lm":  # likewise: another graph of the model directory (an EAGLE layer)
        config["graph"] = graph
    return cache.stage_key("spdflow_export:" + ",".join(impls), __version__, config, inputs)


# ------------------------------------------------------------------------------- stages


class Engine:
    """Runs one recipe; ``run()`` returns the RunState (report written) or raises after
    writing a partial report."""

    def __init__(self, pm, loaded: LoadedRecipe, options: RunOptions, ui=None):
        self.pm = pm
        self.loaded = loaded
        self.recipe = loaded.recipe
        self.options = options
        self.ui = ui or NullUI()
        self.run_dir = self.recipe.output_dir()
        self.state = RunState(self.recipe, self.run_dir)
        self._sessions: list[Any] = []
        self._step_costs = None  # spdflow.engine.generate.StepCosts, made on first use
        self._auxiliary: dict[tuple[str, str], tuple[CompiledProgram, ModelInfo]] = {}
        self._lock = None  # the output dir's lock, held while running
        #: role -> rebuild its program from scratch (when a cached one turns out damaged)
        self._rebuild: dict[str, Any] = {}
        #: role -> the ONNX its export stage wrote (ProposerContext.exported_graph)
        self._exported: dict[str, Path] = {}

    # -- helpers --------------------------------------------------------------------------

    def _begin(self, name: str) -> tuple[StageResult, float]:
        stages = self.state.stages
        if name not in stages:
            # An auxiliary model's stage: listed before generation, in the order they run.
            items = list(stages.items())
            at = [n for n, _ in items].index("generate")
            self.state.stages = stages = dict(items[:at] + [(name, StageResult(name))] + items[at:])
        return stages[name], time.perf_counter()

    def _skip(self, name: str, reason: str) -> None:
        stage = self.state.stages[name]
        stage.status, stage.reason = "skipped", reason
        self.ui.stage(name, "skipped", reason)
        self.pm.hook.spdflow_after_stage(stage=stage, run=self.state)

    def _end(self, stage: StageResult, start: float, status: str, reason: str) -> None:
        stage.status, stage.reason = status, reason
        stage.duration_s = round(time.perf_counter() - start, 4)
        self.ui.stage(stage.name, status, reason)
        self.pm.hook.spdflow_after_stage(stage=stage, run=self.state)

    def backend(self):
        registration = self.pm.lookup("backend", self.recipe.devices.backend)
        return registration.factory()

    # -- export ---------------------------------------------------------------------------

    def target_outputs(self) -> tuple[str, ...]:
        """The extra target outputs the recipe's proposer reads (``Proposer.target_outputs``)."""
        if self.recipe.proposer is None:
            return ()
        factory = self.pm.lookup("proposer", self.recipe.proposer.uses).factory
        return tuple(sorted(getattr(factory, "target_outputs", ()) or ()))

    def export(self, model: ModelSpec, role: str, outputs: tuple[str, ...] = (),
               ccl: bool = False, graph: str = "causal_lm") -> tuple[Path, ModelInfo, str, bool, str]:
        """Export one model (cached); returns (onnx path, model info, key, cached, reason).
        ``ccl`` exports the graph with the ``comp_ctx_lengths`` input; ``graph`` names what is
        exported from the model directory (ExportRequest.graph)."""
        cb = self.recipe.specialization.full_batch_size is not None
        model_dir = self.model_dir(model, role)
        key = export_key(self.pm, model, model_dir, role, cb, outputs, ccl, graph)
        target = self.export_root() / f"{role}-{key[:16]}"
        with cache.build_lock(target):  # runs sharing a cache dir export each model once
            return self._export_locked(model, model_dir, role, cb, key, target, outputs, ccl, graph)

    def model_dir(self, model: ModelSpec, role: str) -> Path:
        """The model's Hugging Face folder; a GGUF file is converted once (cached beside the exports)."""
        from spdflow.models import locate_model, prepare_model_dir

        located = locate_model(model.id, self.loaded.base_dir, model.revision,
                               key="model.id" if role == "target" else "proposer.with.model",
                               allow_outside=self.loaded.allow_outside_paths)
        model_dir, _cached = prepare_model_dir(located, model.dtype, Path(self.options.cache_dir or self.run_dir),
                                               progress=self.ui.message, force=should_force("export", self.options))
        return model_dir

    def export_root(self) -> Path:
        """The folder of exported models: the shared cache dir's, else the run dir's."""
        return Path(self.options.cache_dir or self.run_dir) / "export"

    def _export_locked(self, model: ModelSpec, model_dir: Path, role: str, cb: bool, key: str, target: Path,
                       outputs: tuple[str, ...] = (), ccl: bool = False, graph: str = "causal_lm"):
        if not should_force("export", self.options):
            marker, why = cache.read_done(target, verify=self.options.verify)
            if marker is not None:
                return target / marker["onnx"], ModelInfo.from_json(marker["model_info"]), key, True, f"key {key[:8]}…"
            if target.exists():
                self.ui.warn(f"export of {role} model in '{target}' is not trusted ({why}); rebuilding")
        with atomic_dir(target) as work:
            request = ExportRequest(model=model, model_dir=model_dir, role=role, continuous_batching=cb,
                                    work_dir=work, progress=self.ui.message, outputs=outputs, ccl=ccl,
                                    graph=graph)
            result = self.pm.hook.spdflow_export(request=request)
            if result is None:
                raise PluginError("no plugin implements spdflow_export", hint="reinstall spdflow (the 'onnx' plugin)")
            info = result.model_info
            cache.write_done(work, {"onnx": result.onnx_path.name, "key": key, "model_info": info.to_json()})
        info = ModelInfo.from_json(info.to_json())
        return target / result.onnx_path.name, info, key, False, "no cached export with this key"

    # -- compile --------------------------------------------------------------------------

    def compile(self, onnx: Path, info: ModelInfo, shapes: list[Specialization], k_list: list[int],
                role: str, devices: DevicesSpec, dtype: str, force: bool = False) -> CompiledProgram:
        request = CompileRequest(
            onnx_path=onnx, export_dir=onnx.parent, specializations=shapes, num_speculative_tokens=k_list,
            devices=devices, model_info=info, role=role,
            continuous_batching=self.recipe.specialization.full_batch_size is not None,
            compile_only=self.options.compile_only, force=force or should_force("compile", self.options),
            progress=self.ui.message, dtype=dtype, verify=self.options.verify, warn=self.ui.warn,
            backend_config=plugin_config(self.pm, "backend", devices.backend, devices.with_),
        )
        program = self.pm.hook.spdflow_compile(request=request, backend=self.backend())
        if program is None:
            raise PluginError(f"backend '{devices.backend}' returned no compiled program")
        return program

    def build_model(self, model: ModelSpec, role: str, k_list: list[int], devices: DevicesSpec,
                    graph: str = "causal_lm"):
        """export + specialize + compile one model, each a recorded stage: ``export`` ... for
        the target, ``export:<role>`` ... for an auxiliary model (a draft, an EAGLE layer)."""
        name = stage_namer(role)
        shapes = specializations_for(self.pm, self.recipe, k_list, devices)
        ccl = any(s.comp_ctx_lengths is not None for s in shapes)
        stage, start = self._begin(name("export"))
        try:
            outputs = self.target_outputs() if role == "target" else ()
            onnx, info, key, cached, reason = self.export(model, role, outputs, ccl, graph)
        except BaseException as exc:
            self._end(stage, start, "failed", "interrupted" if isinstance(exc, KeyboardInterrupt) else "export failed")
            raise
        stage.cache_key = key[:16]
        stage.detail = {"export_dir": str(onnx.parent)}  # in the run dir, or a shared cache dir
        if graph != "causal_lm":
            stage.detail["graph"] = graph
        self._exported[role] = onnx
        self._end(stage, start, "cached" if cached else "ran", reason)
        stage, start = self._begin(name("specialize"))
        stage.detail = {"specializations": [s.symbols() for s in shapes]}
        self._end(stage, start, "ran", f"{len(shapes)} shapes")
        stage, start = self._begin(name("compile"))
        try:
            program = self.compile(onnx, info, shapes, k_list, role, devices, model.dtype)
        except BaseException as exc:
            self._end(stage, start, "failed", "interrupted" if isinstance(exc, KeyboardInterrupt) else "compile failed")
            raise
        stage.cache_key = program.key
        stage.detail = {"qpc_dir": str(program.qpc_dir), "command": program.command, "role": role,
                        "runnable": program.runnable}
        if getattr(program, "session_mode", None):  # onnxruntime: which session mode, and why
            stage.detail["session_mode"] = {"mode": program.session_mode,
                                            "why": getattr(program, "session_mode_reason", "")}
        self._end(stage, start, "cached" if program.cached else "ran", program.reason)
        self._rebuild[role] = lambda: self.compile(onnx, info, shapes, k_list, role, devices, model.dtype, force=True)
        return program, info

    def programs(self) -> list[ProgramPlan]:
        """Every program the run compiles: the target's, then each auxiliary model's (a draft
        the proposer declares), with its own shapes and device group."""
        recipe = self.recipe
        plans = [ProgramPlan("target", recipe.model, recipe.k_list(), recipe.devices)]
        for aux in self.auxiliary_models():
            devices = draft_devices(self.pm, recipe.devices,
                                    list(aux.device_ids) if aux.device_ids else None, aux.num_cores)
            # model_id None: a graph built from the target's own directory (an EAGLE layer)
            model = recipe.model if aux.model_id is None else ModelSpec(id=aux.model_id, dtype=recipe.model.dtype)
            k_list = [0, *recipe.k_list()] if aux.k_list is None else list(aux.k_list)
            plans.append(ProgramPlan(aux.role, model, sorted(set(k_list)), devices, aux.graph))
        return plans

    def describe_program(self, plan: ProgramPlan) -> list[str]:
        """--dry-run's account of one program: its shapes, and its directory and exact compile
        command as far as they are known before export (the qpc-<hash> of a graph that is not
        exported yet is shown as such)."""
        from spdflow.models import converted_dir, is_gguf, locate_model

        shapes = specializations_for(self.pm, self.recipe, plan.k_list, plan.devices)
        ccl = any(s.comp_ctx_lengths is not None for s in shapes)
        lines = [f"program '{plan.role}': {plan.model.id} ({plan.model.dtype}), K-list {plan.k_list}, "
                 f"device_ids {plan.devices.device_ids}",
                 f"  specializations ({len(shapes)}):"]
        lines += ["    " + f"{s.kind:8} " + " ".join(f"{k}={v}" for k, v in s.symbols().items()) for s in shapes]
        cb = self.recipe.specialization.full_batch_size is not None
        try:
            model_dir = locate_model(plan.model.id, self.loaded.base_dir, plan.model.revision,
                                     allow_outside=self.loaded.allow_outside_paths)
            if is_gguf(model_dir):
                model_dir = converted_dir(model_dir, plan.model.dtype, Path(self.options.cache_dir or self.run_dir))
                if not cache.read_done(model_dir)[0]:
                    return lines + [f"  compile: known once the GGUF file is converted to {model_dir} (the first run does it)"]
            outputs = self.target_outputs() if plan.role == "target" else ()
            key = export_key(self.pm, plan.model, model_dir, plan.role, cb, outputs, ccl, plan.graph)
        except SpdflowError:
            return lines + ["  compile: known once the model is on this machine (see preflight)"]
        export_dir = self.export_root() / f"{plan.role}-{key[:16]}"
        marker, _ = cache.read_done(export_dir)
        if marker is not None:
            onnx, info = export_dir / marker["onnx"], ModelInfo.from_json(marker["model_info"])
        else:
            onnx, info = export_dir / "model.onnx", _planned_model_info(plan.model.id, model_dir)
        request = CompileRequest(
            onnx_path=onnx, export_dir=export_dir, specializations=shapes, num_speculative_tokens=plan.k_list,
            devices=plan.devices, model_info=info, role=plan.role, continuous_batching=cb, compile_only=True,
            dtype=plan.model.dtype,
            backend_config=plugin_config(self.pm, "backend", plan.devices.backend, plan.devices.with_),
        )
        described = self.backend().describe_compile(request, exported=marker is not None)
        return lines + ["  " + line for line in described]

    def build_auxiliary_models(self, plans: list[ProgramPlan]) -> None:
        """Build the auxiliary programs as stages of their own, so they are cached, reported and
        written under --compile-only like the target's program."""
        for plan in plans:
            self._auxiliary[(plan.role, plan.model.id)] = self.build_model(
                plan.model, plan.role, plan.k_list, plan.devices, plan.graph)

    def auxiliary_models(self) -> list[AuxiliaryModel]:
        """The models the recipe's proposer declares, when a proposer will run."""
        recipe = self.recipe
        if recipe.proposer is None:
            return []
        policy = make_k_policy(self.pm, recipe.k_policy.uses, recipe.k_policy.with_)
        if not speculates(policy, recipe.k_list()):
            return []
        return auxiliary_models(self._proposer_config())

    def _proposer_config(self):
        registration = self.pm.lookup("proposer", self.recipe.proposer.uses)
        config = self.loaded.proposer_config
        if config is None and registration.config is not None:
            config = registration.config.model_validate(self.recipe.proposer.with_)
        return config

    def open_session(self, program: CompiledProgram, role: str | None = None):
        """A session on ``program``. A cached program that fails to load is hashed in full;
        if it is damaged it is rebuilt once (with a warning) instead of failing every rerun."""
        backend = self.backend()
        try:
            session = backend.open_session(program)
        except Exception:
            rebuild = self._rebuild.get(role) if program.cached else None
            marker, why = cache.read_done(Path(program.qpc_dir), verify=True) if rebuild else ({}, "")
            if marker is not None:
                raise
            self.ui.warn(f"cached program '{Path(program.qpc_dir).name}' failed to load and is damaged ({why}); rebuilding")
            program = rebuild()
            if role == "target":
                compile_stage = self.state.stages["compile"]
                compile_stage.status, compile_stage.reason = "ran", f"rebuilt after the cached program failed to load ({why})"
            session = backend.open_session(program)
        self._sessions.append(session)
        return session

    def build_draft_session(self, model_id: str, k_list: list[int], role: str = "draft",
                            device_ids: list[int] | None = None, num_cores: int | None = None):
        """For proposers with their own model: the same stages, its own shapes and devices."""
        built = self._auxiliary.get((role, model_id))
        if built is None:  # a proposer that did not declare the model: build it now
            devices = draft_devices(self.pm, self.recipe.devices, device_ids, num_cores)
            model = ModelSpec(id=model_id, dtype=self.recipe.model.dtype)
            built = self.build_model(model, role, sorted(set(k_list)), devices)
        program, info = built
        if not program.runnable:
            raise StageError("the draft model was compiled with --compile-only and cannot run here")
        return self.open_session(program, role), info

    # -- generate -------------------------------------------------------------------------

    def prepare_generation(self, program: CompiledProgram, info: ModelInfo) -> "PreparedGeneration":
        """Tokenize the workload, check every prompt fits, open the target session and build the
        loop's configuration: the setup ``spdflow run`` and ``spdflow bench`` share."""
        from spdflow.engine.generate import LoopConfig, check_prompts
        from spdflow.workload import load_prompts

        recipe, workload, spec = self.recipe, self.recipe.workload, self.recipe.specialization
        from spdflow.chat import workload_requests

        tokenizer = load_tokenizer(info)
        prompts = load_prompts(workload, self.loaded.base_dir, self.pm, allow_outside=self.loaded.allow_outside_paths)
        # chats rendered with the model's template; the template's end-of-turn ids join the EOS ids
        requests, info, chats = workload_requests(workload, prompts, tokenizer, info, self.pm)
        if any(chats):
            self.ui.message(f"chat prompts rendered with the model's template; stop tokens {list(info.eos_token_ids)}")
        check_prompts(requests, spec.ctx_len)
        session = self.open_session(program, "target")
        sampling = Sampling(workload.temperature, workload.top_k, workload.top_p)
        config = LoopConfig(spec.prefill_seq_len, spec.ctx_len, spec.batch_size, spec.full_batch_size,
                            recipe.k_list(), info.eos_token_ids, info.pad_token_id, info.vocab_size,
                            sampling, workload.ignore_eos)
        return PreparedGeneration(info, tokenizer, requests, session, sampling, config, prompts, chats)

    @property
    def step_costs(self):
        """The step costs this run measured, per session (:class:`~spdflow.engine.generate.StepCosts`)."""
        if self._step_costs is None:
            from spdflow.engine.generate import StepCosts

            self._step_costs = StepCosts()
        return self._step_costs

    def make_acceptor(self):
        """A fresh acceptor of the recipe's acceptance rule."""
        return self.pm.lookup("acceptor", resolve_acceptance(self.pm, self.recipe)).factory()

    def close_sessions(self) -> None:
        """Close every session this engine opened (errors while closing are ignored)."""
        for session in self._sessions:
            try:
                session.close()
            except Exception:
                pass
        self._sessions.clear()

    def generate(self, program: CompiledProgram, info: ModelInfo) -> None:
        from spdflow.engine.generate import Generator

        recipe = self.recipe
        stage, start = self._begin("generate")
        try:
            prepared = self.prepare_generation(program, info)
            tokenizer, requests, session = prepared.tokenizer, prepared.requests, prepared.session
            if callable(getattr(session, "runtime_facts", None)):
                stage.detail["runtime"] = session.runtime_facts()
            sampling, config = prepared.sampling, prepared.config
            info, prompts, chats = prepared.info, prepared.prompts, prepared.chats
            acceptor = self.make_acceptor()
            policy = make_k_policy(self.pm, recipe.k_policy.uses, recipe.k_policy.with_)
            baseline: dict[int, np.ndarray] = {}
            proposer, proposer_name, proposer_plugin = None, "", ""
            if recipe.proposer is not None and speculates(policy, recipe.k_list()):
                proposer_name = recipe.proposer.uses
                proposer_plugin = self._plugin_label(self.pm.lookup("proposer", proposer_name).plugin)
                proposer = self.make_proposer(info, sampling, baseline)
            need_baseline = (self.options.check_lossless or self.options.baseline
                             or getattr(proposer, "needs_reference_output", False))
            if need_baseline and proposer is not None:
                baseline_records: list[dict] = []
                baseline_gen = Generator(self.pm, session, config, acceptor=acceptor, policy=policy,
                                         trace=baseline_records.append, step_costs=self.step_costs)
                with self.ui.generation(sum(r.max_new_tokens for r in requests), "baseline (no-spec)") as bar:
                    baseline_gen.on_tokens = bar.advance
                    for result in baseline_gen.generate(requests):
                        baseline[result.index] = result.tokens
                self.state.baseline = baseline_summary(baseline_records)
            records = self.state.records
            generator = Generator(self.pm, session, config, proposer=proposer, proposer_name=proposer_name,
                                  proposer_plugin=proposer_plugin, policy=policy, acceptor=acceptor, trace=records.append,
                                  step_costs=self.step_costs)
            with self.ui.generation(sum(r.max_new_tokens for r in requests), "generate") as bar:
                generator.on_tokens = bar.advance
                results = generator.generate(requests)
            if proposer is not None:
                proposer.close()
            grid = record_cost_grid(self.pm, session, config, self.run_dir, recipe.devices.backend)
            self.state.outputs = [
                {"request": r.index, "prompt": requests[r.index].prompt, "output": tokenizer.decode(r.tokens.tolist()),
                 "prompt_tokens": requests[r.index].prompt_ids.tolist(), "tokens": r.tokens.tolist(),
                 "stop_reason": r.stop_reason,
                 **({"messages": prompts[r.index] if isinstance(prompts[r.index], list)
                     else [{"role": "user", "content": prompts[r.index]}]} if chats[r.index] else {})}
                for r in results]
            if self.options.check_lossless and proposer is not None:
                mismatched = [r.index for r in results if not np.array_equal(r.tokens, baseline[r.index])]
                self.state.lossless = {"checked": True, "identical": not mismatched, "mismatched_requests": mismatched,
                                       "baseline": "greedy no-spec on the same session" if sampling.temperature == 0
                                       else "no-spec with the same seeds (sampled: identity not expected)"}
            elif self.options.check_lossless:
                self.state.lossless = {"checked": True, "identical": True, "mismatched_requests": [],
                                       "baseline": "this run is the no-spec baseline"}
        except KeyboardInterrupt:
            self._end(stage, start, "failed", "interrupted")
            raise
        except BaseException as exc:
            self._end(stage, start, "failed", _one_line(exc))
            raise
        tokens = sum(len(o["tokens"]) for o in self.state.outputs)
        self._end(stage, start, "ran", f"{len(requests)} requests, {tokens} tokens")
        # after the stage and outside the trace: the oracle's time is in no figure of the run
        from spdflow.oracle import run_oracle

        try:
            self.state.oracle = run_oracle(self, info, requests, {r.index: r.tokens for r in results}, records,
                                           config, grid, proposer is not None)
        except Exception as exc:  # the report says why; the run's own result stands
            self.state.oracle = {"computed": False, "reason": f"not computed: {type(exc).__name__}: {exc}"}

    def check_lossless(self) -> None:
        """A greedy run whose tokens differ from the no-spec baseline fails (its own exit code).
        Sampled runs only record the comparison: identity is not expected there."""
        lossless = self.state.lossless
        if not lossless or lossless["identical"] or self.recipe.workload.temperature != 0:
            return
        mismatched = lossless["mismatched_requests"]
        raise LosslessError(f"--check-lossless: the output of {len(mismatched)} request(s) {mismatched[:10]} differs "
                            "from the greedy no-spec baseline",
                            hint="speculation changed the output: a plugin (proposer, acceptor, K policy) or the "
                                 "backend is at fault; rerun with --verify to rule out a damaged cache")

    def make_proposer(self, info: ModelInfo, sampling: Sampling, baseline: dict):
        """The recipe's proposer; ``baseline`` holds the no-spec tokens per request, for proposers
        that read the reference output."""
        from spdflow.engine.generate import read_only_copy

        recipe = self.recipe
        registration = self.pm.lookup("proposer", recipe.proposer.uses)
        config = self._proposer_config()
        ctx = ProposerContext(recipe=recipe, target=info, sampling=sampling, run_dir=self.run_dir, base_dir=self.loaded.base_dir,
                              build_session=self.build_draft_session, exported_graph=self._exported.get,
                              reference_output=lambda i: read_only_copy(baseline[i]))
        try:
            return registration.factory(config, ctx)
        except SpdflowError:
            raise
        except Exception as exc:
            raise PluginError(f"proposer '{recipe.proposer.uses}' ({self._plugin_label(registration.plugin)}) failed to start: "
                              f"{type(exc).__name__}: {exc}") from exc

    def _plugin_label(self, plugin: str) -> str:
        """The "plugin 'name' version" label of error messages that blame a plugin."""
        info = self.pm.infos.get(plugin)
        version = f" {info.version}" if info is not None and info.version else ""
        return f"plugin '{plugin}'{version}"

    # -- the whole run --------------------------------------------------------------------

    def preflight(self) -> None:
        """Check everything checkable before any work (``spdflow.preflight``, the same checks as
        lint and --dry-run): warnings are shown, errors stop the run before the output dir exists."""
        from spdflow.preflight import preflight, run_blockers

        findings = preflight(self.loaded, self.pm)
        for finding in findings:
            if finding.severity == "warning" and finding.code not in ("SPD104", "SPD112"):
                self.ui.warn(f"{finding.location.render()}: {finding.code} {finding.message}")
        outside = [f for f in findings if f.code == "SPD112"]
        if outside and not self.loaded.allow_outside_paths:  # lint warns; run refuses
            from spdflow.recipe.paths import ALLOW_FLAG, PathOutsideRecipeError

            raise PathOutsideRecipeError(f"the recipe reads files outside its folder ({len(outside)})", findings=outside,
                                         hint=f"keep them inside the recipe's folder, or pass {ALLOW_FLAG} "
                                              "if you trust this recipe")
        blockers = run_blockers(findings, compile_only=self.options.compile_only)
        if blockers:
            count = f"{len(blockers)} problem{'s' if len(blockers) > 1 else ''}"
            only_backend = all(f.code == "SPD104" for f in blockers)
            raise PreflightError(f"cannot run this recipe here ({count}, found before any export)", findings=blockers,
                                 hint="`--compile-only` builds the program without running it" if only_backend else
                                 f"fix each one; `spdflow lint {self.loaded.path}` shows the same checks")

    def run(self) -> RunState:
        """Run every stage under a :class:`SignalGuard`: SIGINT and SIGTERM at any moment give an
        interrupted report (exit 130 / 143), never a finished run or a previous run's report."""
        from spdflow.engine.signals import SignalGuard

        with SignalGuard() as self.signals:
            try:
                return self._run()
            finally:
                if self._lock is not None:
                    self._lock.release()
                    self._lock = None

    def _open_output_dir(self) -> None:
        """Create and lock the output dir, remove stale temps and the previous run's report."""
        from spdflow.engine.outdir import open_output_dir

        if self._lock is None:
            self._lock = open_output_dir(self.run_dir)
            remove_previous_report(self.run_dir)

    def _run(self) -> RunState:
        state = self.state
        try:
            self.preflight()
        except KeyboardInterrupt as exc:
            self._open_output_dir()
            self._interrupted(exc)
        self._open_output_dir()
        self.pm.hook.spdflow_before_run(recipe=self.recipe, run=state)
        try:
            self.signals.check()  # one that arrived (and was swallowed) during start-up
            target, *auxiliary = self.programs()
            program, info = self.build_model(target.model, target.role, target.k_list, target.devices)
            self.build_auxiliary_models(auxiliary)
            self.signals.check()
            if self.options.compile_only or not program.runnable:
                # The engine's rule, whatever the backend and whether the programs were cached.
                programs = 1 + len(self._auxiliary)
                why = "compile-only" if self.options.compile_only else "the target program cannot run here"
                self._skip("generate", f"{why}: {programs} program(s) written, nothing generated")
            else:
                self.generate(program, info)
            self.signals.check()
            self.check_lossless()
            state.status = "ok"
        except KeyboardInterrupt as exc:
            self._interrupted(exc)
        except SpdflowError as exc:
            state.status = "failed"
            state.error = {"stage": _current_stage(state), "message": exc.message}
            self._finish()
            self._after_finish(exc)
            raise
        except Exception as exc:
            state.status = "failed"
            state.error = {"stage": _current_stage(state), "message": _one_line(exc)}
            self._finish()
            self._after_finish(exc)
            raise StageError(f"stage '{_current_stage(state)}' failed: {_one_line(exc)}") from exc
        self._finish()
        self._after_finish(None)
        return state

    def _interrupted(self, exc: BaseException | None):
        """Record the interrupt, write the report (signals deferred meanwhile) and raise."""
        import signal

        from spdflow.engine.signals import DESCRIPTIONS
        from spdflow.errors import RunTerminated

        state = self.state
        signum = self.signals.signum_of(exc)
        state.status = "interrupted"
        state.error = {"stage": _current_stage(state), "message": DESCRIPTIONS[signum]}
        self._finish()
        error = RunTerminated if signum == signal.SIGTERM else RunInterrupted
        raise error(f"{DESCRIPTIONS[signum]}; the partial report is in {self.run_dir / 'report.json'}") from exc

    def _after_finish(self, error: BaseException | None) -> None:
        """A signal that arrived while the report was written still makes the run interrupted."""
        if self.signals.received is not None and self.state.status != "interrupted":
            self._interrupted(error)

    def _finish(self) -> None:
        self.close_sessions()
        with self.signals.deferred():
            self._write_report()

    def _write_report(self) -> None:
        self.pm.hook.spdflow_after_run(recipe=self.recipe, run=self.state)
        stage, start = self._begin("report")
        files = "report.json, report.md, report.html"
        # report.json records its own stage as ran: it is written by this very stage, so a failure
        # to write it leaves no report.json to contradict (the stage line then says failed).
        stage.status, stage.reason = "ran", files
        try:
            from spdflow.report.build import write_run_report

            write_run_report(self)
            self._end(stage, start, "ran", files)
        except Exception as exc:  # the report must never hide the run's own error
            self._end(stage, start, "failed", _one_line(exc))
            if self.state.status == "ok":
                raise StageError(f"cannot write the run report in '{self.run_dir}': {_one_line(exc)}") from exc


# ------------------------------------------------------------------------------- small helpers

#: the files of a run's report; a new run removes the previous run's before any work
REPORT_FILES = ("report.json", "report.md", "report.html", "outputs.jsonl", "trace.jsonl")


def remove_previous_report(run_dir: Path) -> None:
    """An interrupted or crashed run must never leave the previous run's report in place."""
    for name in REPORT_FILES:
        try:
            (run_dir / name).unlink()
        except FileNotFoundError:
            pass


def record_cost_grid(pm, session, config, run_dir: Path, backend: str):
    """Time the run's compiled decode shapes at its batch size and store them with the run
    (``cost_grid.json``, read by the ``measured`` what-if cost model); returns the entry."""
    from spdflow.costs import measure_grid, write_grid

    rows = config.full_batch_size or config.batch_size
    entry = measure_grid(pm, session, rows, config.k_list, config.pad_token_id, config.prefill_seq_len,
                         config.full_batch_size is not None)
    write_grid(run_dir, {rows: entry}, backend)
    return entry


def baseline_summary(records: list[dict]) -> dict[str, Any]:
    """The no-spec baseline's speed figures, from its own trace records."""
    from spdflow.report.metrics import compute_metrics

    m = compute_metrics(records)
    return {"decode_tokens_per_s": m.decode_tokens_per_s, "e2e_tokens_per_s": m.e2e_tokens_per_s,
            "tpot_median_s": m.tpot_median_s, "ttft_median_s": m.ttft_median_s, "wall_s": m.wall_s,
            "generated_tokens": m.generated_tokens, "decode_steps": m.decode_steps,
            "step_costs": [c.model_dump() for c in m.step_costs]}


def _planned_model_info(model_id: str, model_dir: Path) -> ModelInfo:
    """What is known of a model before its export: the layer count from its config.json."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    layers = config.get("num_hidden_layers", 0) if isinstance(config, dict) else 0
    return ModelInfo(model_id, str(config.get("model_type", "")) if isinstance(config, dict) else "", 0,
                     int(layers) if isinstance(layers, int) else 0, 0, 0, (), 0, Path(model_dir), None)


def load_tokenizer(info: ModelInfo):
    from tokenizers import Tokenizer

    if info.tokenizer_file is None or not Path(info.tokenizer_file).is_file():
        raise StageError(f"model '{info.name}' has no tokenizer.json in '{info.source_dir}'",
                         hint="spdflow reads the fast-tokenizer file; save one with tokenizer.save_pretrained()")
    return Tokenizer.from_file(str(info.tokenizer_file))


def _current_stage(state: RunState) -> str:
    for name, stage in state.stages.items():
        if stage.status in ("failed", "running"):
            return name
    for name, stage in state.stages.items():
        if stage.status == "not_run":
            return name
    return "report"


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, SpdflowError):
        return exc.message
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
