"""The plugin manager: entry-point loading, the registry of named implementations, listing.

No manager exists at import time: ``get_plugin_manager()`` builds one per call (one per CLI
invocation, one per test).
"""
from __future__ import annotations

import difflib
import importlib.metadata
import os
from dataclasses import dataclass, field
from typing import Any

import pluggy

from spdflow import hookspecs
from spdflow.api import REGISTRATION_KINDS, Registration
from spdflow.errors import PluginError

ENTRY_POINT_GROUP = "spdflow"

_REGISTER_HOOKS = {
    "proposer": "spdflow_register_proposers",
    "backend": "spdflow_register_backends",
    "k_policy": "spdflow_register_k_policies",
    "acceptor": "spdflow_register_acceptors",
    "workload": "spdflow_register_workloads",
    "cost_model": "spdflow_register_cost_models",
}


@dataclass
class PluginInfo:
    """One loaded (or failed) plugin, as ``spdflow plugins`` shows it."""

    name: str
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None
    hooks: list[str] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None


class SpdflowPluginManager(pluggy.PluginManager):
    """pluggy's manager plus what spdflow keeps about each plugin."""

    def __init__(self) -> None:
        super().__init__("spdflow")
        self.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self._registry: dict[str, dict[str, Registration]] | None = None
        #: kind -> name -> why the name is unusable (two plugins registered it)
        self._conflicts: dict[str, dict[str, str]] = {kind: {} for kind in REGISTRATION_KINDS}

    # -- loading -------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        """Load every ``spdflow`` entry point, each in its own try/except.

        ``SPDFLOW_LOAD_PLUGINS`` (comma-separated entry-point names, may be empty) restricts
        which are loaded.
        """
        allowed = os.environ.get("SPDFLOW_LOAD_PLUGINS")
        allow = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if allow is not None and ep.name not in allow:
                continue
            if self.get_plugin(ep.name) is not None or ep.name in self.infos:
                continue
            dist = getattr(ep, "dist", None)
            info = PluginInfo(
                name=ep.name,
                distribution=dist.name if dist else None,
                version=dist.version if dist else None,
                entry_point=ep.value,
            )
            self.infos[ep.name] = info
            try:
                module = ep.load()
                self.register(module, name=ep.name)
                unknown = unknown_hooks(self, module)
                if unknown:
                    raise PluginError(unknown)
            except (Exception, SystemExit) as exc:  # a broken plugin must not break the others
                # SystemExit too: a plugin that calls sys.exit() at import must not end spdflow.
                if self.get_plugin(ep.name) is not None:
                    self.unregister(name=ep.name)
                info.error = exc.message if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"

    def add_plugin(self, plugin: Any, name: str, *, distribution: str | None = None, version: str | None = None) -> None:
        """Register an in-process plugin (built-ins, tests, embedding applications)."""
        self.register(plugin, name=name)
        self.infos[name] = PluginInfo(name=name, distribution=distribution, version=version)
        self._registry = None

    # -- registry ------------------------------------------------------------------------

    def registry(self) -> dict[str, dict[str, Registration]]:
        """kind -> name -> Registration, built once by calling every registration hook.

        Each hook implementation is called on its own so every registration knows its plugin.
        A plugin whose registration hook raises is unregistered with its error kept (``spdflow
        plugins`` shows it); a name two plugins register is unusable, and looking it up is a
        PluginError naming both. Either way only recipes that use those names fail.
        """
        if self._registry is not None:
            return self._registry
        table: dict[str, dict[str, Registration]] = {kind: {} for kind in REGISTRATION_KINDS}
        failed: dict[str, str] = {}
        owners: dict[tuple[str, str], str] = {}  # (kind, name) -> the first plugin that registered it
        self._conflicts = {kind: {} for kind in REGISTRATION_KINDS}
        for info in self.infos.values():
            info.registered = {}
        for kind, hook_name in _REGISTER_HOOKS.items():
            hook = getattr(self.hook, hook_name)
            for impl in hook.get_hookimpls():
                plugin_name = self.get_name(impl.plugin) or "?"
                if plugin_name in failed:
                    continue
                mine: list[Registration] = []

                def register(name, factory, *, config=None, description="", aliases=(), _kind=kind, _plugin=plugin_name,
                             _mine=mine):
                    if not isinstance(name, str) or not name:
                        raise PluginError(f"plugin '{_plugin}' registered a {_kind} without a name")
                    _mine.append(Registration(_kind, name, factory, config, _plugin, description, tuple(aliases)))

                try:
                    impl.function(register)
                except (Exception, SystemExit) as exc:
                    failed[plugin_name] = exc.message if isinstance(exc, PluginError) else \
                        f"plugin '{plugin_name}' failed in {hook_name}: {type(exc).__name__}: {exc}"
                    continue
                for registration in mine:
                    for key in (registration.name, *registration.aliases):  # an alias finds the same registration
                        first = owners.setdefault((kind, key), plugin_name)
                        if first == plugin_name:
                            table[kind][key] = registration
                            continue
                        # Neither plugin can be trusted with the name: recipes that use it fail (exit 4).
                        table[kind].pop(key, None)
                        message = f"{kind} '{key}' is registered twice, by plugin '{first}' and by plugin '{plugin_name}'"
                        self._conflicts[kind][key] = message
                        self.infos.setdefault(plugin_name, PluginInfo(name=plugin_name)).error = message
        for plugin_name, message in failed.items():
            # A plugin that broke while registering is unregistered whole, its error kept for `spdflow plugins`.
            self.infos.setdefault(plugin_name, PluginInfo(name=plugin_name)).error = message
            for names in table.values():
                for name in [n for n, r in names.items() if r.plugin == plugin_name]:
                    del names[name]
            if self.get_plugin(plugin_name) is not None:
                self.unregister(name=plugin_name)
        for kind, names in table.items():
            for key, registration in names.items():
                if key != registration.name:
                    continue  # aliases are listed with their registration, not as names of their own
                info = self.infos.setdefault(registration.plugin, PluginInfo(name=registration.plugin))
                info.registered.setdefault(kind, []).append(registration.name)
        self._registry = table
        return table

    def lookup(self, kind: str, name: str) -> Registration:
        """The registration of ``name``; a PluginError with a did-you-mean if unknown."""
        table = self.registry()[kind]
        if name in table:
            return table[name]
        if name in self._conflicts[kind]:
            raise PluginError(self._conflicts[kind][name], hint="uninstall one of the two plugins")
        raise PluginError(unknown_name_message(kind, name, list(table), aliases_of(self, kind)),
                          hint=unknown_name_hint(kind, name, self))

    def describe(self) -> list[PluginInfo]:
        """Every plugin with its hooks and registered names (registry built if possible)."""
        try:
            self.registry()
        except PluginError:
            pass
        for name, info in self.infos.items():
            plugin = self.get_plugin(name)
            if plugin is not None:
                info.hooks = sorted(impl.name for impl in _hookimpls_of(self, plugin))
        return sorted(self.infos.values(), key=lambda i: i.name)


def unknown_hooks(pm: pluggy.PluginManager, plugin: Any) -> str | None:
    """The error of a plugin that implements hooks spdflow does not have (a misspelled name)."""
    names = sorted(caller.name for caller in pm.get_hookcallers(plugin) or []
                   if caller.spec is None and any(impl.plugin is plugin and not impl.optionalhook
                                                  for impl in caller.get_hookimpls()))
    if not names:
        return None
    known = [name for name in dir(hookspecs) if name.startswith("spdflow_")]
    parts = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1)
        parts.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return f"implements unknown hook{'s' if len(names) > 1 else ''} {', '.join(parts)}"


def _hookimpls_of(pm: pluggy.PluginManager, plugin: Any):
    for caller in pm.get_hookcallers(plugin) or []:
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin:
                yield caller


_LABELS = {"k_policy": ("K policy", "K policies")}


def kind_label(kind: str, plural: bool = False) -> str:
    """``proposer`` / ``proposers``, ``K policy`` / ``K policies``: a registration kind in prose."""
    singular, many = _LABELS.get(kind, (kind.replace("_", " "), kind.replace("_", " ") + "s"))
    return many if plural else singular


def unknown_name_message(kind: str, name: str, known: list[str], aliases: dict[str, str] | None = None) -> str:
    """``unknown proposer 'ngrams'; did you mean 'ngram' (another name for 'prompt_lookup')?``"""
    message = f"unknown {kind_label(kind)} '{name}'"
    close = difflib.get_close_matches(name, known, n=1) or difflib.get_close_matches(name.lower(), known, n=1)
    if close:
        target = (aliases or {}).get(close[0])
        message += f"; did you mean '{close[0]}'" + (f" (another name for '{target}')?" if target else "?")
    return message


def aliases_of(pm: "SpdflowPluginManager", kind: str) -> dict[str, str]:
    """alias -> registered name, for one kind."""
    return {key: r.name for key, r in pm.registry()[kind].items() if key != r.name}


def unknown_name_hint(kind: str, name: str, pm: "SpdflowPluginManager") -> str:
    aliases = aliases_of(pm, kind)
    known = sorted(key for key in pm.registry()[kind] if key not in aliases)
    known = [k + "".join(f" (or {a})" for a, target in sorted(aliases.items()) if target == k) for k in known]
    broken = [i.name for i in pm.infos.values() if i.error]
    hint = f"installed {kind_label(kind, plural=True)}: {', '.join(known) or 'none'}"
    if broken:
        hint += f"; plugins that failed to load: {', '.join(broken)} (see `spdflow plugins`)"
    return hint


def plugin_config(pm: "SpdflowPluginManager", kind: str, name: str, settings: dict | None) -> Any:
    """The ``with:`` block ``settings`` validated by the config model ``name`` registered.

    None when the plugin registered no model. The recipe loader reports a bad block with its
    location first, so one here (a bench row, a draft model) is a one-sentence RecipeError.
    """
    from pydantic import ValidationError

    from spdflow.errors import RecipeError

    registration = pm.lookup(kind, name)
    if registration.config is None:
        return None
    try:
        return registration.config.model_validate(settings or {})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RecipeError(f"the settings of {kind.replace('_', ' ')} '{name}' are invalid: {where}: {first['msg']}") from None


def backend_ccl(pm: "SpdflowPluginManager", devices) -> dict[str, list[int] | None]:
    """The compute context lengths of a devices section's ``with:`` block, as the keyword
    arguments of ``spdflow_specialize``: ``comp_ctx_lengths`` and ``comp_ctx_lengths_prefill``
    (both None when the backend has no CCL settings or they are unset)."""
    config = plugin_config(pm, "backend", devices.backend, devices.with_)
    return {name: (list(getattr(config, name)) if getattr(config, name, None) is not None else None)
            for name in ("comp_ctx_lengths", "comp_ctx_lengths_prefill")}


def make_k_policy(pm: "SpdflowPluginManager", name: str, settings: dict | None = None):
    """A fresh K policy: ``factory(config)`` when it registered a config model, else ``factory()``."""
    registration = pm.lookup("k_policy", name)
    config = plugin_config(pm, "k_policy", name, settings)
    return registration.factory() if registration.config is None else registration.factory(config)


def required_ks(policy, k_list) -> list[int]:
    """The Ks ``policy`` may choose from ``k_list`` (every K for a policy without ``required_ks``,
    e.g. one that does not derive from :class:`spdflow.api.KPolicy`)."""
    ask = getattr(policy, "required_ks", None)
    return list(ask(k_list)) if ask is not None else sorted(set(k_list))


#: How specific an acceptor's ``lossless_at`` is (``acceptance: auto`` prefers the most specific).
_LOSSLESS_AT = {"zero": 0, "positive": 0, "any": 1}


def lossless_at(registration: Registration, temperature: float) -> bool | None:
    """Whether the acceptor of ``registration`` keeps the output distribution at ``temperature``
    (None: it does not declare it, :attr:`spdflow.api.Acceptor.lossless_at`)."""
    declared = getattr(registration.factory, "lossless_at", None)
    if declared not in _LOSSLESS_AT:
        return None
    return declared == "any" or declared == ("zero" if temperature == 0 else "positive")


def auto_acceptor(pm: "SpdflowPluginManager", temperature: float) -> str | None:
    """What ``acceptance: auto`` runs at ``temperature``: of the registered acceptors lossless
    there, one declared for that kind of decoding alone before one for any temperature, then
    spdflow's own before a third party's, then by name. None when none is lossless."""
    registrations = {r.name: r for r in pm.registry()["acceptor"].values()}.values()
    lossless = [r for r in registrations if lossless_at(r, temperature)]
    if not lossless:
        return None

    def rank(r: Registration):
        info = pm.infos.get(r.plugin)
        return (_LOSSLESS_AT[r.factory.lossless_at], (info.distribution if info else None) != "spdflow", r.name)

    return min(lossless, key=rank).name


def resolve_acceptance(pm: "SpdflowPluginManager", recipe) -> str:
    """The acceptor a recipe runs: the one it names, or for ``auto`` :func:`auto_acceptor`."""
    if recipe.acceptance != "auto":
        return recipe.acceptance
    name = auto_acceptor(pm, recipe.workload.temperature)
    if name is None:
        raise PluginError(f"acceptance auto: no installed acceptor keeps the output distribution at temperature "
                          f"{recipe.workload.temperature}", hint="name one with acceptance: NAME (see `spdflow plugins`)")
    return name


def speculates(policy, k_list) -> bool:
    """Whether ``policy`` ever verifies K > 0 on this K-list (else no proposer is built)."""
    return max(required_ks(policy, k_list), default=0) > 0


def get_plugin_manager(*, load_entry_points: bool = True) -> SpdflowPluginManager:
    """A fresh plugin manager with the built-in glue and (by default) every installed plugin."""
    from spdflow import builtin

    pm = SpdflowPluginManager()
    pm.add_plugin(builtin, "builtin", distribution="spdflow")
    if load_entry_points:
        pm.load_entry_points()
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"a plugin implements an unknown hook: {exc}") from exc
    return pm
