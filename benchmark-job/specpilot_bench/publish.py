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

import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from specpilot.api import seal
from specpilot.api.base import GROUP, VERSION
from specpilot.api.profile import SpeculationProfile, SpeculationProfileStatus

from .profiles import merged_status

PLURAL = "speculationprofiles"
OPERATOR_FIELDS = frozenset({"phase", "reason", "message", "attempts"})
"""Status fields only the operator writes (it decides a profile's phase); the bench leaves them as they are."""
RETRYABLE_STATUS = {409, 429, 500, 502, 503, 504}


class PublishError(RuntimeError):
    """The API refused the status for good (or kept failing past the retry budget)."""


def api_client(kubeconfig: str | None = None):
    """CustomObjectsApi from the pod's ServiceAccount, or from a kubeconfig when given (tests, laptops)."""
    from kubernetes import client, config

    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    return client.CustomObjectsApi()


def _retrying(what: str, call, attempts: int = 8, base_delay_s: float = 0.5):
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except ApiException as exc:
            if exc.status not in RETRYABLE_STATUS or attempt >= attempts:
                raise PublishError(f"{what}: HTTP {exc.status} {exc.reason}: {(exc.body or '')[:500]}") from exc
            reason = f"HTTP {exc.status}"
        except (HTTPError, OSError) as exc:
            if attempt >= attempts:
                raise PublishError(f"{what}: {exc}") from exc
            reason = str(exc)
        delay = min(30.0, base_delay_s * 2 ** (attempt - 1)) * (0.5 + random.random())
        print(f"[specpilot-bench] {what} failed ({reason}); retry {attempt}/{attempts - 1} in {delay:.1f} s",
              file=sys.stderr, flush=True)
        time.sleep(delay)


class ProfileStore:
    """One SpeculationProfile object in the API."""

    def __init__(self, api, name: str, namespace: str, append: bool = False, token: str | None = None) -> None:
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
        return self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)

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
            self.api.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, self.name, body)
            return merged

        published = _retrying(f"patch {PLURAL}/{self.name}/status in {self.namespace}", attempt)
        self.engine_starts_published = starts
        self.points_published = {run.num_speculative_tokens: len(run.points) for run in status.runs}
        return published
