"""The benchmark Job's status write: the standard library's HTTP client over the operator's Connection, so the bench
needs no Kubernetes client (the demo's set-up and the benchmark image install none). Against a local HTTP server
that answers as an API server does: the get, the conditional merge patch of the status subresource, the bearer
token from a kubeconfig, a 409 merged again, a refusal reported with its status and body."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from specpilot.api.profile import ProfilePhase, Run, SpeculationProfileStatus
from specpilot_bench.publish import ProfileApi, ProfileStore, PublishError

from test_bench_refine import pt

PATH = "/apis/specpilot.io/v1alpha1/namespaces/team-a/speculationprofiles/p1"


class FakeApiServer(BaseHTTPRequestHandler):
    """One SpeculationProfile; `answers` queues statuses to send instead of the normal answer."""

    obj: dict = {}
    requests: list[dict] = []
    answers: list[tuple[int, str]] = []

    def log_message(self, *_):  # keep pytest's output clean
        pass

    def _send(self, status: int, body: dict | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        request = {"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                   "content_type": self.headers.get("Content-Type"), "body": body}
        self.requests.append(request)
        return request

    def do_GET(self) -> None:
        self._record()
        if self.path != PATH:
            return self._send(404, {"kind": "Status", "reason": "NotFound"})
        self._send(200, self.obj)

    def do_PATCH(self) -> None:
        request = self._record()
        if self.answers:
            status, text = self.answers.pop(0)
            return self._send(status, text)
        patch = request["body"]
        version = patch.get("metadata", {}).get("resourceVersion")
        if version and version != self.obj["metadata"]["resourceVersion"]:
            return self._send(409, {"kind": "Status", "reason": "Conflict"})
        type(self).obj = {**self.obj, "status": {**self.obj.get("status", {}), **patch["status"]},
                          "metadata": {**self.obj["metadata"],
                                       "resourceVersion": str(int(self.obj["metadata"]["resourceVersion"]) + 1)}}
        self._send(200, self.obj)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ThreadingHTTPServer, Path]]:
    FakeApiServer.obj = {"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile",
                         "metadata": {"name": "p1", "namespace": "team-a", "resourceVersion": "7"},
                         "spec": {}, "status": {"phase": "Running", "attempts": 1}}
    FakeApiServer.requests = []
    FakeApiServer.answers = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{httpd.server_address[1]}"}}],
        "users": [{"name": "u", "user": {"token": "bench-token"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "c", "user": "u"}}]}))
    try:
        yield httpd, kubeconfig
    finally:
        httpd.shutdown()
        thread.join()


def test_publish_reads_then_merge_patches_the_status_with_the_version_it_read(server):
    _, kubeconfig = server
    store = ProfileStore(ProfileApi.load(str(kubeconfig)), "p1", "team-a", token="result-token")
    status = SpeculationProfileStatus(phase=ProfilePhase.SUCCEEDED, engine_starts=1,
                                      runs=[Run(num_speculative_tokens=0, points=[pt(1)])])
    store.publish(status, [0])
    get, patch = FakeApiServer.requests
    assert (get["method"], get["path"], get["auth"]) == ("GET", PATH, "Bearer bench-token")
    assert (patch["method"], patch["path"]) == ("PATCH", PATH + "/status")
    assert patch["content_type"] == "application/merge-patch+json" and patch["auth"] == "Bearer bench-token"
    assert patch["body"]["metadata"] == {"resourceVersion": "7"}
    stored = FakeApiServer.obj["status"]
    assert stored["runs"][0]["points"][0]["concurrency"] == 1 and stored["seal"]
    assert (stored["phase"], stored["attempts"]) == ("Running", 1)  # the operator's fields are left alone


def test_a_conflict_reads_and_merges_again(server):
    _, kubeconfig = server
    FakeApiServer.answers = [(409, json.dumps({"kind": "Status", "reason": "Conflict"}))]
    store = ProfileStore(ProfileApi.load(str(kubeconfig)), "p1", "team-a")
    store.publish(SpeculationProfileStatus(engine_starts=1, runs=[Run(num_speculative_tokens=0, points=[pt(2)])]),
                  [0])
    assert [r["method"] for r in FakeApiServer.requests] == ["GET", "PATCH", "GET", "PATCH"]
    assert FakeApiServer.obj["status"]["runs"][0]["points"][0]["concurrency"] == 2


def test_a_refusal_names_the_status_and_the_api_servers_words(server):
    _, kubeconfig = server
    FakeApiServer.answers = [(422, json.dumps({"kind": "Status", "message": "status.runs: Too many: 99"}))]
    store = ProfileStore(ProfileApi.load(str(kubeconfig)), "p1", "team-a")
    with pytest.raises(PublishError, match=r"HTTP 422 .*status.runs: Too many: 99"):
        store.publish(SpeculationProfileStatus(runs=[Run(num_speculative_tokens=0, points=[pt(1)])]), [0])


def test_a_missing_profile_is_not_retried(server):
    _, kubeconfig = server
    store = ProfileStore(ProfileApi.load(str(kubeconfig)), "absent", "team-a")
    with pytest.raises(PublishError, match="HTTP 404"):
        store.read()
    assert len(FakeApiServer.requests) == 1


def test_an_unusable_kubeconfig_is_a_publish_error_naming_it(tmp_path):
    with pytest.raises(PublishError, match="does not exist"):
        ProfileApi.load(str(tmp_path / "absent"))


def test_the_bench_loads_without_the_official_kubernetes_client():
    """The demo's set-up installs no Kubernetes client: the bench's import of its publish path must not need one."""
    code = ("import importlib.abc, sys\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'kubernetes':\n"
            "            raise ModuleNotFoundError(name, name=name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import specpilot_bench.cli, specpilot_bench.publish\n"
            "assert 'kopf' not in sys.modules, 'the bench imports kopf'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
