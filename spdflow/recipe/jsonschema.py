"""The recipe's JSON Schema, with each installed proposer's ``with:`` config as a branch."""
from __future__ import annotations

from spdflow.recipe.schema import Recipe


def recipe_json_schema(pm) -> dict:
    """JSON Schema (draft 2020-12) of a recipe; proposer.with is validated per proposer.uses."""
    schema = Recipe.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "spdflow recipe"
    defs = schema.setdefault("$defs", {})
    branches = []
    for name, registration in sorted(pm.registry()["proposer"].items()):
        if registration.config is None:
            continue
        sub = registration.config.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
        for key, value in sub.pop("$defs", {}).items():
            defs.setdefault(key, value)
        def_name = f"proposer_{name}_config"
        defs[def_name] = sub
        branches.append({"if": {"properties": {"uses": {"const": name}}},
                         "then": {"properties": {"with": {"$ref": f"#/$defs/{def_name}"}}}})
    proposer = defs.get("ProposerSpec")
    if proposer is not None:
        proposer["properties"]["uses"]["enum"] = sorted(pm.registry()["proposer"])
        if branches:
            proposer["allOf"] = branches
    for kind, path in (("backend", ("DevicesSpec", "backend")), ("k_policy", (None, "k_policy"))):
        names = sorted(pm.registry()[kind])
        target = defs.get(path[0]) if path[0] else schema
        if target and names:
            target["properties"][path[1]]["enum"] = names
    return schema
