"""Offline validation of a custom resource against its CRD, as the API server would do it.

Applies schema defaults, checks the openAPIV3Schema (jsonschema, draft 4 semantics as in OpenAPI
3.0), then evaluates every `x-kubernetes-validations` CEL rule (cel-python) at its place in the
object, with `oldSelf` for transition rules when an old object is given. Used by `specpilot validate`,
the tests, and the operator's tests on every object it writes.
"""

from __future__ import annotations

import copy
import difflib
from functools import lru_cache
from typing import Any

import celpy
import jsonschema

from .base import ECHO_LIMIT, cap, echo


def _schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Fill `default`s into absent fields, recursively, as the API server does before validating."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(sub, obj[name])
    elif isinstance(obj, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in obj]
    return obj


@lru_cache(maxsize=256)
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _path(base: str, key: str | int) -> str:
    return f"{base}[{key}]" if isinstance(key, int) else f"{base}.{key}" if base else key


def _cel(schema: dict[str, Any], obj: Any, old: Any, path: str, errors: list[str]) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        expr = rule["rule"]
        if "oldSelf" in expr and old is None:
            continue  # a transition rule only applies to updates
        activation = {"self": celpy.json_to_cel(obj)}
        if old is not None:
            activation["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok = _program(expr).evaluate(activation)
        except celpy.CELEvalError as exc:
            errors.append(f"{path or '<root>'}: rule {expr!r} could not be evaluated: {exc}")
            continue
        if not bool(ok):
            errors.append(f"{path or '<root>'}: {rule.get('message', 'failed rule ' + expr)}")
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                sub_old = old.get(name) if isinstance(old, dict) else None
                _cel(sub, obj[name], sub_old, _path(path, name), errors)
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            # Correlating list items needs list-map keys; without them (or for sets) old items are not paired.
            _cel(schema["items"], item, None, _path(path, i), errors)


def _structure_checks(schema: dict[str, Any], obj: Any, path: str, errors: list[str]) -> None:
    if isinstance(obj, list):
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen = set()
            for i, item in enumerate(obj):
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    errors.append(f"{_path(path, i)}: Duplicate value: {dict(zip(keys, key))}")
                seen.add(key)
        elif schema.get("x-kubernetes-list-type") == "set" and len(set(map(repr, obj))) != len(obj):
            errors.append(f"{path}: Duplicate value in a set")
        for i, item in enumerate(obj):
            _structure_checks(schema.get("items", {}), item, _path(path, i), errors)
    elif isinstance(obj, dict):
        props = schema.get("properties")
        if props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            for name in obj:
                if name not in props:
                    near = difflib.get_close_matches(str(name), list(props), n=1, cutoff=0.6)
                    hint = f"did you mean `{near[0]}`?" if near else "kubectl explain lists the known ones"
                    errors.append(f"{_path(path, name)}: unknown field ({hint})")
        for name, sub in (props or {}).items():
            if name in obj:
                _structure_checks(sub, obj[name], _path(path, name), errors)


def _schema_message(err: jsonschema.ValidationError) -> str:
    """jsonschema's message without the offending value in full (a 1,000-item list would be printed whole)."""
    value, limit = err.instance, err.validator_value
    if err.validator == "maxItems":
        return f"has {len(value)} items, more than the {limit} allowed"
    if err.validator == "maxLength":
        return f"is {len(value)} characters long, more than the {limit} allowed ({echo(value, 60)})"
    if err.validator == "maxProperties":
        return f"has {len(value)} keys, more than the {limit} allowed"
    if err.validator == "pattern":
        return f"{echo(value)} does not match {limit!r}"
    return cap(err.message, 3 * ECHO_LIMIT)


def validate_custom_resource(crd: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Problems the API server would report for `obj` (empty list: it would be accepted)."""
    schema = _schema_of(crd)
    kind = crd["spec"]["names"]["kind"]
    errors: list[str] = []
    if obj.get("kind") != kind:
        errors.append(f"kind: expected {kind} (got {obj.get('kind')!r})")
    obj = apply_defaults(schema, copy.deepcopy(obj))
    validator = jsonschema.Draft4Validator(schema)
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        path = ""
        for part in err.absolute_path:
            path = _path(path, part)
        errors.append(f"{cap(path or '<root>')}: {_schema_message(err)}")
    _structure_checks(schema, obj, "", errors)
    if not errors:
        old_defaulted = apply_defaults(schema, copy.deepcopy(old)) if old is not None else None
        _cel(schema, obj, old_defaulted, "", errors)
    return errors
