"""Deep merge of a user's free-form pod overrides (`serving.podOverrides`, `profiling.podOverrides`) into
the pod spec specpilot builds.

Rules, close to a strategic merge patch so they read the way `kubectl patch` users expect:
- dicts merge recursively; a `null` value removes the key (as in a JSON merge patch);
- lists of named things merge item by item on their key (`containers`, `initContainers`, `volumes`,
  `env`, `imagePullSecrets` by `name`; `volumeMounts` by `mountPath`, so mounting weights into the
  engine keeps its /dev/shm): a matching item is merged recursively, a new one is appended;
- every other list (args, tolerations, ...) is replaced by the override's.
The builders then put back the few fields specpilot owns (see `serving.py` and `benchmark.py`).
"""

from __future__ import annotations

import copy
from typing import Any

LIST_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
}
"""Field name -> the key that identifies an item of that list."""


def deep_merge(base: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    """A new dict: `override` merged into `base` by the module's rules; neither argument is changed."""
    merged = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        elif isinstance(value, list) and isinstance(merged.get(key), list) and key in LIST_MERGE_KEYS:
            merged[key] = _merge_list(merged[key], value, LIST_MERGE_KEYS[key])
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_list(base: list[Any], override: list[Any], item_key: str) -> list[Any]:
    merged = copy.deepcopy(base)
    index = {item.get(item_key): i for i, item in enumerate(merged) if isinstance(item, dict)}
    for item in override:
        position = index.get(item.get(item_key)) if isinstance(item, dict) else None
        if position is None:
            merged.append(copy.deepcopy(item))
            if isinstance(item, dict):
                index[item.get(item_key)] = len(merged) - 1
        else:
            merged[position] = deep_merge(merged[position], item)
    return merged
