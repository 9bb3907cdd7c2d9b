"""Results only a profile's own benchmark Job can write.

Every benchmark pod of a namespace runs as the same ServiceAccount, which may patch the status of the
namespace's SpeculationProfiles (Kubernetes RBAC cannot name objects that do not exist yet). So the
operator does not trust who wrote a result; it checks a seal:

- Before it creates a profile's Job, the operator draws a nonce and stores it in the profile's
  `specpilot.io/result-nonce` annotation (metadata: the benchmark identity may patch status only).
- The Job carries `token = HMAC(key, namespace/profile/nonce)` in its bench container's environment
  (`SPECPILOT_RESULT_TOKEN`). The key is the operator's own (a Secret mounted into the operator only).
- The benchmark seals what it publishes: `status.seal = HMAC(token, canonical(sealed fields))`.
- The operator recomputes both before a result is used. A result written by another profile's Job, by a
  pod that borrowed the benchmark ServiceAccount, or by an earlier Job of the same profile (another nonce)
  does not match and is refused.

The canonical form survives the API server's JSON round trip: numbers are compared by value (an integral
float is the integer; others by their shortest repr), keys sorted, nulls dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
from typing import Any

NONCE_ANNOTATION = "specpilot.io/result-nonce"
EPOCH_ANNOTATION = "specpilot.io/measurement"
"""On a SpeculationProfile: the current measurement (set when the operator creates or restarts it). Every nonce of
its Jobs starts with it, so a Job is adopted only into the measurement it was created for."""
"""On a SpeculationProfile: the nonce the current benchmark Job's token was derived from."""
TOKEN_ENV = "SPECPILOT_RESULT_TOKEN"
"""The bench container's environment variable that carries the Job's token."""
KEY_ENV = "SPECPILOT_RESULT_KEY"
"""The operator's environment variable that carries its key (from a Secret)."""
MAX_NONCES = 2
"""Nonces the annotation may hold (space-separated): the measurement's and a refinement round's."""
SEALED_FIELDS = ("runs", "kvCapacityTokens", "maxConcurrencyMeasured", "hardware", "validation",
                 "engineVersion", "startedAt", "completedAt", "benchFailure")
"""The status fields a seal covers: everything a decision or a check reads from a result, and the benchmark's
own account of a failure (which the operator quotes)."""

__all__ = ["EPOCH_ANNOTATION", "KEY_ENV", "NONCE_ANNOTATION", "SEALED_FIELDS", "TOKEN_ENV", "adoption_problem",
           "canonical", "job_token", "new_epoch", "new_nonce",
           "seal", "seal_problem"]


def new_epoch() -> str:
    """A new measurement of a profile (its creation, each restart): the nonces of its Jobs carry it."""
    return secrets.token_hex(8)


def new_nonce(epoch: str = "") -> str:
    """A fresh result nonce for one benchmark Job of the measurement `epoch`."""
    random = secrets.token_hex(16)
    return f"{epoch}.{random}" if epoch else random


def adoption_problem(key: bytes, namespace: str, profile: dict[str, Any], job: dict[str, Any]) -> str | None:
    """Why a benchmark Job whose nonce the profile does not record may not become its current Job (None: the
    operator created it for this measurement, and stopped before recording it). A Job carried over from an
    earlier measurement (its nonce's epoch is not the profile's: a replayed nonce, whose token may have been read
    off the old Job) or made by anyone else (its token is not the one the operator derives for its nonce) is
    refused: its result would otherwise be sealed with a token someone else holds."""
    annotations = (profile.get("metadata") or {}).get("annotations") or {}
    epoch = annotations.get(EPOCH_ANNOTATION)
    nonce = ((job.get("metadata") or {}).get("annotations") or {}).get(NONCE_ANNOTATION)
    name = (profile.get("metadata") or {}).get("name", "")
    if not isinstance(nonce, str) or not nonce:
        return "it carries no result nonce"
    if not epoch:
        return "the profile records no measurement to adopt it into (a profile from before nonces carried one)"
    if not nonce.startswith(f"{epoch}."):
        return "its result nonce belongs to an earlier measurement of the profile (a replayed nonce)"
    token = token_of(job)
    if token is None or not hmac.compare_digest(token, job_token(key, namespace, name, nonce)):
        return "its result token is not the one the operator gives that nonce (the operator did not create it)"
    return None


def job_token(key: bytes, namespace: str, profile: str, nonce: str) -> str:
    """The token one benchmark Job seals its profile's results with."""
    return hmac.new(key, f"{namespace}/{profile}/{nonce}".encode(), hashlib.sha256).hexdigest()


def _normal(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        number = float(value)
        if not math.isfinite(number):
            return repr(number)
        if number.is_integer() and abs(number) < 2**53:
            return int(number)
        return repr(number)
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return str(value)


def canonical(status: dict[str, Any]) -> bytes:
    """The sealed fields of a status (camelCase, as stored), in a form independent of JSON formatting."""
    sealed = {field: status.get(field) for field in SEALED_FIELDS if status.get(field) is not None}
    return json.dumps(_normal(sealed), sort_keys=True, separators=(",", ":")).encode()


def seal(token: str, status: dict[str, Any]) -> str:
    """The seal a benchmark Job writes beside its result."""
    return hmac.new(token.encode(), canonical(status), hashlib.sha256).hexdigest()


def token_of(job: dict[str, Any]) -> str | None:
    """The result token a benchmark Job carries (what its bench container reads), or None."""
    for container in ((job.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == TOKEN_ENV:
                return env.get("value")
    return None


def sealed(status: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """`status` with the seal `job`'s token gives it: what the benchmark publishes."""
    token = token_of(job)
    return {**status, "seal": seal(token, status)} if token else dict(status)


def sealing_nonce(key: bytes, namespace: str, profile: dict[str, Any]) -> str | None:
    """The nonce (of those the annotation holds) whose Job sealed the profile's current result, or None."""
    nonces = (((profile.get("metadata") or {}).get("annotations") or {}).get(NONCE_ANNOTATION) or "").split()
    status = profile.get("status") or {}
    written = status.get("seal")
    name = (profile.get("metadata") or {}).get("name", "")
    if not isinstance(written, str) or not written:
        return None
    return next((one for one in nonces[:MAX_NONCES]
                 if hmac.compare_digest(written, seal(job_token(key, namespace, name, one), status))), None)


def seal_problem(key: bytes, namespace: str, profile: dict[str, Any]) -> str | None:
    """Why the profile's result is not its own benchmark Job's (None: the seal matches)."""
    nonce = ((profile.get("metadata") or {}).get("annotations") or {}).get(NONCE_ANNOTATION)
    status = profile.get("status") or {}
    name = (profile.get("metadata") or {}).get("name", "")
    if not nonce:
        return "no benchmark Job was started for it by the operator (no result nonce)"
    written = status.get("seal")
    if not isinstance(written, str) or not written:
        return "the result carries no seal (it was not written by its benchmark Job)"
    # A refinement round adds its Job's nonce after the measured one's: either may have sealed the result.
    if not any(hmac.compare_digest(written, seal(job_token(key, namespace, name, one), status))
               for one in nonce.split()[:MAX_NONCES]):
        return "the result's seal does not match (it was not written by this profile's current benchmark Job)"
    return None
