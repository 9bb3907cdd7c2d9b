"""Reading a SpeculationProfile's spec from the Kubernetes API and publishing its status back.

The Job's ServiceAccount (in-cluster config) may get and patch `speculationprofiles/status` in its
namespace, nothing more. Each publish reads the object, merges this Job's runs into what other Jobs of
the same profile already published, and patches the status with the resourceVersion it read, so a
concurrent writer makes the API answer 409 and we merge again. Transient errors retry with backoff.
What a Job publishes is its measured result and its seal (api.seal), never `phase`, `reason`, `message` or
`attempts`: those are the operator's, which derives them from the Job's state and the seal check (a Job's
failure is its exit code; its explanation is in its log and the printed result).
A launching Job publishes after each run and at the end: each publish adds only the engine starts made
since its previous one. A refinement Job (`--append`) appends its points to the stored runs of the same K
instead of replacing them (`profiles.merged_status`); each publish then adds only the points measured since
its previous one, so publishing after each run and at the end never appends a point twice.
"""

from __future__ import annotations

import http.client
import json
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from specpilot.api import seal
from specpilot.api.base import GROUP, VERSION
from specpilot.api.profile import SpeculationProfile, SpeculationProfileStatus
from specpilot.controller.connection import ConfigError, Connection

from .profiles import merged_status

PLURAL = "speculationprofiles"
OPERATOR_FIELDS = frozenset({"phase", "reason", "message", "attempts"})
"""Status fields only the operator writes (it decides a profile's phase); the bench leaves them as they are."""
RETRYABLE_STATUS = {409, 429, 500, 502, 503, 504}
REQUEST_TIMEOUT_S = 30.0
MAX_ERROR_BODY = 64 * 1024


class PublishError(RuntimeError):
    """The API refused the status for good (or kept failing past the retry budget)."""


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason, self.body = status, reason, body


class ProfileApi:
    """The bench's two calls (get a SpeculationProfile, merge-patch its status) on the standard library's HTTP
    client, over the operator's `Connection`: the pod's service account in a Job, a kubeconfig elsewhere. The
    benchmark image then carries no Kubernetes client, and the bench installs nothing beyond the operator's
    own dependencies."""

    def __init__(self, connection: Connection, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.connection = connection
        self.timeout_s = timeout_s
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler(
            {"http": connection.proxy, "https": connection.proxy} if connection.proxy else {})]
        context = connection.ssl_context()
        if context:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    @classmethod
    def load(cls, kubeconfig: str | None = None) -> ProfileApi:
        """From `kubeconfig` when given (tests, laptops), else the pod's service account, else KUBECONFIG or
        ~/.kube/config."""
        try:
            return cls(Connection.load(kubeconfig))
        except ConfigError as err:
            raise PublishError(f"cannot reach the Kubernetes API: {err}") from None

    def _path(self, namespace: str, name: str, subresource: str = "") -> str:
        quote = urllib.parse.quote
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{PLURAL}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> dict:
        headers = {"Accept": "application/json", **self.connection.headers()}
        data = None
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode()
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.connection.server + path, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            text = err.read(MAX_ERROR_BODY).decode("utf-8", "replace")
            raise ApiError(err.code, str(err.reason), text) from None

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call("GET", self._path(namespace, name))

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the status subresource (a resourceVersion in `body` makes it conditional)."""
        return self._call("PATCH", self._path(namespace, name, "status"), body, "application/merge-patch+json")


def _retrying(what: str, call, attempts: int = 8, base_delay_s: float = 0.5):
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except ApiError as exc:
            if exc.status not in RETRYABLE_STATUS or attempt >= attempts:
                raise PublishError(f"{what}: HTTP {exc.status} {exc.reason}: {(exc.body or '')[:500]}") from exc
            reason = f"HTTP {exc.status}"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # OSError: refused, reset, timed out (URLError is one); ValueError: a body that is not JSON.
            if attempt >= attempts:
                raise PublishError(f"{what}: {exc}") from exc
            reason = str(exc) or type(exc).__name__
        delay = min(30.0, base_delay_s * 2 ** (attempt - 1)) * (0.5 + random.random())
        print(f"[specpilot-bench] {what} failed ({reason}); retry {attempt}/{attempts - 1} in {delay:.1f} s",
              file=sys.stderr, flush=True)
        time.sleep(delay)


class ProfileStore:
    """One SpeculationProfile object in the API."""

    def __init__(self, api: ProfileApi, name: str, namespace: str, append: bool = False, token: str | None = None) -> None:
        self.api = api
        self.name = name
        self.namespace = namespace
        self.append = append
        self.token = token
        """The Job's result token (api.seal): every published status carries its seal. Without one (a run
        outside a Job the operator created) nothing is sealed, and the operator will not use the result."""
        """Append this process's points to the stored runs (a refinement round) instead of replacing runs."""
        self.engine_starts_published = 0
        """This process's engine starts already added to the stored count."""
        self.points_published: dict[int, int] = {}
        """Append mode: per K, this process's points already appended."""

    def _get(self) -> dict[str, Any]:
        return self.api.get(self.namespace, self.name)

    def read(self) -> SpeculationProfile:
        """The profile as stored (its spec says what to measure)."""
        obj = _retrying(f"get {PLURAL}/{self.name} in {self.namespace}", self._get)
        return SpeculationProfile.model_validate(obj)

    def publish(self, status: SpeculationProfileStatus, expected_ks: Sequence[int]) -> dict[str, Any]:
        """Merge `status` into the stored one and patch it; returns the status as published.

        `status.engine_starts` counts this process's starts so far; the stored count already holds those
        published before (and other Jobs' and attempts'), so only the new ones are added."""
        starts = status.engine_starts or 0
        update: dict[str, Any] = {"engine_starts": starts - self.engine_starts_published}
        if self.append:
            update["runs"] = [run.model_copy(update={"points": run.points[self.points_published.get(
                run.num_speculative_tokens, 0):]}) for run in status.runs]
        unpublished = status.model_copy(update=update)

        def attempt() -> dict[str, Any]:
            current = self._get()
            merged = merged_status(current.get("status"), unpublished, expected_ks, append=self.append).dump()
            merged["seal"] = seal.seal(self.token, merged) if self.token else None
            body: dict[str, Any] = {"status": {k: v for k, v in merged.items() if k not in OPERATOR_FIELDS}}
            version = current.get("metadata", {}).get("resourceVersion")
            if version:
                # Optimistic concurrency: a writer in between makes the API answer 409, and we merge again.
                body["metadata"] = {"resourceVersion": version}
            self.api.patch_status(self.namespace, self.name, body)
            return merged

        published = _retrying(f"patch {PLURAL}/{self.name}/status in {self.namespace}", attempt)
        self.engine_starts_published = starts
        self.points_published = {run.num_speculative_tokens: len(run.points) for run in status.runs}
        return published
