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
