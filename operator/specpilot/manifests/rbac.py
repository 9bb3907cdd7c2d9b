"""The benchmark Jobs' least-privilege identity: one ServiceAccount, Role and RoleBinding per namespace.

The bench reads its SpeculationProfile and writes the results into its status; it can do nothing else
(no other resources, no spec writes, no list/watch, no create/delete).
"""

from __future__ import annotations

import copy
from typing import Any

from ..api.base import GROUP
from . import names

BENCH_RULES = [
    {"apiGroups": [GROUP], "resources": ["speculationprofiles"], "verbs": ["get"]},
    {"apiGroups": [GROUP], "resources": ["speculationprofiles/status"], "verbs": ["get", "patch"]},
]


def bench_rbac(namespace: str, owner: dict[str, Any] | None = None,
               cluster_role: str | None = None) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding named `specpilot-bench` in `namespace`.

    With `cluster_role` (the chart ships one with BENCH_RULES), no Role: the RoleBinding refers to that
    ClusterRole, so the operator needs no right to create Roles, only `bind` on that one ClusterRole.

    `owner` is an ownerReference (apiVersion, kind, name, uid); it is added as a non-controller owner,
    because several SpeculativeDeployments of a namespace share the set and the operator may add each
    of them as an owner: the set is collected when the last one goes.
    """
    metadata: dict[str, Any] = {"name": names.BENCH_SERVICE_ACCOUNT, "namespace": namespace,
                                "labels": names.bench_rbac_labels()}
    if owner is not None:
        metadata["ownerReferences"] = [{**{k: owner[k] for k in ("apiVersion", "kind", "name", "uid")},
                                        "controller": False, "blockOwnerDeletion": False}]
    if cluster_role is not None:
        return [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": copy.deepcopy(metadata)},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": copy.deepcopy(metadata),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
             "subjects": [{"kind": "ServiceAccount", "name": names.BENCH_SERVICE_ACCOUNT, "namespace": namespace}]},
        ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": copy.deepcopy(metadata)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": copy.deepcopy(metadata),
         "rules": copy.deepcopy(BENCH_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": copy.deepcopy(metadata),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.BENCH_SERVICE_ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": names.BENCH_SERVICE_ACCOUNT, "namespace": namespace}]},
    ]
