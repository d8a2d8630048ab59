"""The recipe's JSON Schema, with each installed plugin's ``with:`` config as a branch."""
from __future__ import annotations

from spdflow.recipe.schema import Recipe

#: kind -> (the $defs entry of its recipe section, the key that names the plugin)
_SECTIONS = {"proposer": ("ProposerSpec", "uses"), "backend": ("DevicesSpec", "backend"),
             "k_policy": ("KPolicySpec", "uses")}


def recipe_json_schema(pm) -> dict:
    """JSON Schema (draft 2020-12) of a recipe; each ``with:`` is validated per plugin name."""
    schema = Recipe.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "spdflow recipe"
    defs = schema.setdefault("$defs", {})
    registry = pm.registry()
    for kind, (section_name, name_key) in _SECTIONS.items():
        section = defs.get(section_name)
        names = sorted(registry[kind])
        if section is None or not names:
            continue
        section["properties"][name_key]["enum"] = names
        branches = []
        for name in names:
            registration = registry[kind][name]
            if registration.config is None:
                continue
            def_name = f"{kind}_{name}_config"
            defs[def_name] = _config_schema(registration.config, defs)
            branches.append({"if": {"properties": {name_key: {"const": name}}},
                             "then": {"properties": {"with": {"$ref": f"#/$defs/{def_name}"}}}})
        if branches:
            section["allOf"] = branches
    for branch in schema["properties"]["k_policy"].get("anyOf", []):
        if branch.get("type") == "string":  # the bare-name form
            branch["enum"] = sorted(registry["k_policy"])
    ks = schema["properties"].get("num_speculative_tokens")
    if ks is not None and "anyOf" not in ks:  # an int means [K]: editors must accept both
        item = {"type": "integer", "minimum": 0, "maximum": 64}
        schema["properties"]["num_speculative_tokens"] = {
            **{k: v for k, v in ks.items() if k not in ("type", "items")},
            "anyOf": [item, {"type": "array", "items": item, "minItems": 1}],
        }
    return schema


def _config_schema(model, defs: dict) -> dict:
    """A plugin config model's schema, its own $defs hoisted into the recipe's."""
    sub = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    for key, value in sub.pop("$defs", {}).items():
        defs.setdefault(key, value)
    return sub


#: kind -> (the recipe key its ``with:`` block sits under, what to call one) for the README's tables
_WITH_KEYS = {"backend": ("devices.with", "backend"), "proposer": ("proposer.with", "proposer"),
              "k_policy": ("k_policy.with", "K policy")}


def with_fields_markdown(pm, distribution: str | None = "spdflow") -> str:
    """The README's tables of every plugin's ``with:`` fields, generated from
    :func:`recipe_json_schema` (name, type, default, description), one table per kind.

    ``distribution`` keeps the plugins of that distribution only (the built-ins by default, so
    the README does not change with what else is installed); None keeps all.
    """
    schema = recipe_json_schema(pm)
    defs = schema["$defs"]
    registry = pm.registry()
    lines: list[str] = []
    for kind, (key, label) in _WITH_KEYS.items():
        rows = []
        for name in sorted(registry[kind]):
            registration = registry[kind][name]
            info = pm.infos.get(registration.plugin)
            if registration.name != name or registration.config is None:
                continue  # an alias, or a plugin without settings
            if distribution is not None and (info is None or info.distribution != distribution):
                continue
            config = defs[f"{kind}_{name}_config"]
            required = set(config.get("required", []))
            for field, spec in config.get("properties", {}).items():
                default = "required" if field in required else _default_text(spec)
                rows.append(f"| `{name}` | `{field}` | {_type_text(spec)} | {default} | "
                            f"{_cell(spec.get('description', ''))} |")
        if rows:
            lines += [f"`{key}` ({label} settings):", "",
                      f"| {label} | field | type | default | meaning |", "|---|---|---|---|---|", *rows, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _type_text(spec: dict) -> str:
    if "enum" in spec:
        return " or ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{spec['const']}`"
    if "anyOf" in spec:
        return " or ".join(_type_text(s) for s in spec["anyOf"])
    if "$ref" in spec:
        return spec["$ref"].rsplit("/", 1)[-1]
    kind = spec.get("type", "any")
    if kind == "array" and isinstance(spec.get("items"), dict):
        return f"list of {_type_text(spec['items'])}"
    return str(kind)


def _default_text(spec: dict) -> str:
    """The default as JSON (what a recipe would write); "—" for none or one computed per recipe."""
    import json

    value = spec.get("default")
    return "—" if value is None else f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")
