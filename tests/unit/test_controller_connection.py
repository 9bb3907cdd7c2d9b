"""How the operator reaches its API server without the official client: kubeconfig contexts, tokens that rotate,
TLS with the cluster's CA and a client certificate, an exec plugin through the official client, and what each
kind of answer becomes (issue 27: the client's import was 20 MiB of the operator's memory)."""

from __future__ import annotations

import base64
import json
import ssl
import sys
from pathlib import Path

import pytest
import trustme
import yaml
from aiohttp import web

from specpilot.controller import connection as connection_module
from specpilot.controller.connection import ConfigError, Connection
from specpilot.controller.kube import Kube, NotFound, Refused, Unreachable, kopf_connection_info


def b64(text: str | bytes) -> str:
    return base64.b64encode(text if isinstance(text, bytes) else text.encode()).decode()


def kubeconfig(path: Path, clusters: dict, users: dict, contexts: dict, current: str | None) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": c} for n, c in contexts.items()],
    }))
    return path


def test_the_current_context_or_the_one_named_with_files_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "token").write_text("from-a-file\n")
    path = kubeconfig(tmp_path / "config", {
        "prod": {"server": "https://prod.example:6443/", "certificate-authority-data": b64("PEM-CA")},
        "dev": {"server": "http://127.0.0.1:8001", "insecure-skip-tls-verify": True},
    }, {
        "ops": {"tokenFile": "creds/token"},
        "me": {"token": "inline", "client-certificate": "creds/me.crt", "client-key": "/abs/me.key"},
    }, {
        "prod": {"cluster": "prod", "user": "ops", "namespace": "team-a"},
        "dev": {"cluster": "dev", "user": "me"},
    }, current="prod")

    prod = Connection.load(str(path))
    assert prod.server == "https://prod.example:6443" and prod.ca_data == "PEM-CA"
    assert prod.bearer() == "from-a-file"
    assert prod.headers() == {"Authorization": "Bearer from-a-file"}
    assert prod.default_namespace == "team-a"
    assert kopf_connection_info(prod).token == "from-a-file"

    dev = Connection.load(str(path), "dev")
    assert dev.insecure and dev.bearer() == "inline"
    assert dev.cert_path == str(tmp_path / "creds" / "me.crt") and dev.key_path == "/abs/me.key"
    assert dev.ssl_context() is False  # plain http


def test_a_kubeconfig_list_is_merged_first_one_wins_and_an_absent_file_is_skipped(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    first = kubeconfig(tmp_path / "a", {"c": {"server": "http://first"}}, {"u": {"token": "t1"}},
                       {"x": {"cluster": "c", "user": "u"}}, current=None)
    second = kubeconfig(tmp_path / "b", {"c": {"server": "http://second"}}, {}, {}, current="x")
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path / 'absent'}:{second}")
    merged = Connection.load()
    assert merged.server == "http://first" and merged.bearer() == "t1"


@pytest.mark.parametrize(("contexts", "current", "context", "says"), [
    ({"x": {"cluster": "c", "user": "u"}}, None, None, "has no current-context: pass --context"),
    ({"x": {"cluster": "c", "user": "u"}}, "x", "y", "context 'y' is not in"),
    ({"x": {"cluster": "other", "user": "u"}}, "x", None, "names cluster 'other', which is not defined"),
])
def test_a_kubeconfig_that_cannot_be_used_says_why(tmp_path: Path, contexts, current, context, says) -> None:
    path = kubeconfig(tmp_path / "config", {"c": {"server": "http://c"}}, {"u": {}}, contexts, current)
    with pytest.raises(ConfigError, match=says):
        Connection.load(str(path), context)


def test_a_missing_kubeconfig_names_itself(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Connection.load(str(tmp_path / "nope"))


def test_in_a_pod_the_service_account_token_is_read_again_as_it_rotates(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "token").write_text("first")
    (tmp_path / "namespace").write_text("specpilot-system")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setattr(connection_module, "SERVICE_ACCOUNT", tmp_path)
    pod = Connection.in_cluster(tmp_path)
    assert pod.server == "https://10.0.0.1:443" and pod.ca_path == str(tmp_path / "ca.crt")
    assert pod.default_namespace == "specpilot-system"
    assert pod.bearer() == "first"
    (tmp_path / "token").write_text("second")
    assert pod.bearer() == "first"  # read again once a minute, not at every request
    monkeypatch.setattr(connection_module, "TOKEN_REREAD_S", 0.0)
    assert pod.bearer() == "second"
    (tmp_path / "token").unlink()  # mid-rotation: the last token is kept
    assert pod.bearer() == "second"


def test_in_a_pod_without_a_token_mounted_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with pytest.raises(ConfigError, match="automountServiceAccountToken"):
        Connection.in_cluster(tmp_path)


def test_an_exec_plugin_user_gets_its_token_from_the_plugin(tmp_path: Path) -> None:
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": "from-the-plugin"}}
    path = kubeconfig(tmp_path / "config", {"c": {"server": "https://eks.example"}}, {"u": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
        "args": ["-c", f"print({json.dumps(json.dumps(credential))})"], "interactiveMode": "Never"}}},
        {"x": {"cluster": "c", "user": "u"}}, current="x")
    connection = Connection.load(str(path))
    assert connection.bearer() == "from-the-plugin"


class TlsApiServer:
    """An HTTPS API server (trustme's CA) that wants a client certificate and a bearer token."""

    def __init__(self, ca: trustme.CA) -> None:
        self.ca, self.seen = ca, []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path_qs, request.headers.get("Authorization"),
                          request.headers.get("Content-Type"), await request.text()))
        if request.headers.get("Authorization") != "Bearer good":
            return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
        if request.path.endswith("/missing"):
            return web.json_response({"kind": "Status"}, status=404)
        if request.path.endswith("/refused"):
            return web.json_response({"kind": "Status", "message": "spec.replicas: Invalid value"}, status=422)
        return web.json_response({"kind": "Service", "metadata": {"name": request.path.rsplit("/", 1)[-1]}})

    async def __aenter__(self) -> str:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1").configure_cert(context)
        self.ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the client's certificate is checked too
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        return f"https://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_) -> None:
        await self.runner.cleanup()


async def test_requests_go_over_tls_with_the_clusters_ca_a_client_certificate_and_the_token(tmp_path: Path) -> None:
    ca = trustme.CA()
    client_cert = ca.issue_cert("specpilot-operator")
    server = TlsApiServer(ca)
    async with server as url:
        path = kubeconfig(tmp_path / "config", {"c": {"server": url, "certificate-authority-data": b64(
            ca.cert_pem.bytes())}}, {"u": {"token": "good", "client-certificate-data": b64(
                client_cert.cert_chain_pems[0].bytes()), "client-key-data": b64(client_cert.private_key_pem.bytes())}},
            {"x": {"cluster": "c", "user": "u"}}, current="x")
        kube = Kube(Connection.load(str(path)))
        try:
            got = await kube.get("services", "team", "llama")
            assert got["metadata"]["name"] == "llama"
            await kube.patch("services", "team", "llama", {"metadata": {"labels": {"a": "b"}}})
            with pytest.raises(NotFound):
                await kube.get("services", "team", "missing")
            with pytest.raises(Refused) as refused:
                await kube.get("services", "team", "refused")
            assert refused.value.status == 422 and "spec.replicas: Invalid value" in str(refused.value)
        finally:
            await kube.close()
    assert server.seen[0][:3] == ("GET", "/api/v1/namespaces/team/services/llama", "Bearer good")
    method, path_qs, auth, content_type, body = server.seen[1]
    assert (method, content_type, auth) == ("PATCH", "application/merge-patch+json", "Bearer good")
    assert json.loads(body) == {"metadata": {"labels": {"a": "b"}}}


async def test_an_untrusted_server_certificate_or_a_wrong_token_is_not_served(tmp_path: Path) -> None:
    ca, other = trustme.CA(), trustme.CA()
    client_cert = ca.issue_cert("specpilot-operator")
    server = TlsApiServer(ca)
    async with server as url:
        def connect(trusted: trustme.CA, token: str) -> Kube:
            path = kubeconfig(tmp_path / f"config-{token}", {"c": {"server": url, "certificate-authority-data": b64(
                trusted.cert_pem.bytes())}}, {"u": {"token": token, "client-certificate-data": b64(
                    client_cert.cert_chain_pems[0].bytes()), "client-key-data": b64(
                    client_cert.private_key_pem.bytes())}}, {"x": {"cluster": "c", "user": "u"}}, current="x")
            return Kube(Connection.load(str(path)))

        untrusted = connect(other, "good")
        with pytest.raises(Unreachable):
            await untrusted.get("services", "team", "llama")
        await untrusted.close()
        assert server.seen == []  # the TLS handshake failed: the token was never sent
        wrong = connect(ca, "bad")
        with pytest.raises(Refused) as refused:
            await wrong.get("services", "team", "llama")
        await wrong.close()
        assert refused.value.status == 401
        assert server.seen[-1][2] == "Bearer bad"
