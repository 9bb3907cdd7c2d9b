"""Which metrics URLs a SpeculativeDeployment may make the operator read: the admin's allow-list.

The operator reads Prometheus from its own network position, so a URL taken from a tenant's spec would let
the tenant make it GET anything it can reach. A per-deployment `spec.metrics.prometheusUrl` is therefore
used only when it matches an entry of the operator config's `allowedPrometheusUrls`:
- an exact base URL, `https://prometheus.team-a.svc:9090` (a trailing slash does not matter), or
- a prefix ending in `/*`, `https://thanos.example.com/tenants/*`: the same scheme, host and port, and a path
  that continues below the prefix at a `/`.
Scheme and host compare case-insensitively and an omitted port is the scheme's default. A URL with user
info, a query, a fragment, a backslash, a `.`/`..` path segment or a percent escape never matches, so a
prefix cannot be left by path tricks.

The operator config's own `prometheusUrl` is allowed too, exactly (never as a prefix): it is the admin's
choice, and the operator reads it for every deployment that names no URL, so a spec that names it reaches
nothing it would not reach anyway (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from ..api.deployment_spec import SpeculativeDeploymentSpec
    from ..config import OperatorConfig

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _parts(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path without trailing slash) of a plain http(s) URL; None for anything else."""
    if not isinstance(url, str) or any(c in url for c in "\\%@?#") or any(c.isspace() or ord(c) < 32 for c in url):
        return None
    try:
        split = urlsplit(url)
        port = split.port
    except ValueError:
        return None
    scheme = split.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not split.hostname:
        return None
    path = split.path.rstrip("/")
    if any(segment in (".", "..") for segment in path.split("/")):
        return None
    return scheme, split.hostname.lower(), port or _DEFAULT_PORTS[scheme], path


def url_allowed(url: str, allowed: Sequence[str]) -> bool:
    """Whether `url` matches an entry of the allow-list (see the module docstring)."""
    target = _parts(url)
    if target is None:
        return False
    for entry in allowed:
        prefix = entry.endswith("/*")
        parts = _parts(entry[:-2] if prefix else entry)
        if parts is None or parts[:3] != target[:3]:
            continue
        if target[3] == parts[3] or (prefix and target[3].startswith(parts[3] + "/")):
            return True
    return False


def same_url(url: str, other: str) -> bool:
    """Whether two plain http(s) URLs name the same base: scheme, host, port and path (a trailing slash, the
    case of scheme and host, and a default port written or not do not matter)."""
    target = _parts(url)
    return target is not None and target == _parts(other)


def refusal(url: str, allowed: Sequence[str], own: str = "") -> str | None:
    """Why `spec.metrics.prometheusUrl` is not used, naming the field and the fix; None when it is allowed: it
    matches an entry of `allowed`, or it is `own`, the operator's own prometheusUrl."""
    if url_allowed(url, allowed) or same_url(url, own):
        return None
    where = ("the operator config's allowedPrometheusUrls is empty" if not allowed
             else "it matches no entry of the operator config's allowedPrometheusUrls")
    return (f"spec.metrics.prometheusUrl is refused: {where}, and the operator reads only the Prometheus its "
            "administrator chose. Remove spec.metrics.prometheusUrl to use the operator's prometheusUrl, use "
            "spec.metrics.source: pods, or ask the cluster administrator to add the URL to allowedPrometheusUrls")


def prometheus_url_refusal(spec: SpeculativeDeploymentSpec, config: OperatorConfig) -> str | None:
    """Why the operator does not read the deployment's own spec.metrics.prometheusUrl, or None (no URL named,
    or one it may read): what the operator reports as MetricsAvailable=False (PrometheusUrlNotAllowed) and
    `specpilot validate` as a warning."""
    url = spec.metrics.prometheus_url
    if spec.metrics.source != "prometheus" or not url:
        return None
    return refusal(url, config.allowed_prometheus_urls, own=config.prometheus_url)
