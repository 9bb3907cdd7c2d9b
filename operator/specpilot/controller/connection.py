"""Where the API server is and how to authenticate: a kubeconfig (file and context) or the pod's service account.

Read here without the official Kubernetes client: importing it costs the operator about 20 MiB of RSS (its
generated model classes), and its blocking transport needs a thread per request in flight. Nor kopf: the benchmark
Job's status write (specpilot_bench.publish) connects through this module too. The fields read are
the ones a kubeconfig for a cluster's API server carries: the server, its CA (file or data), TLS verification
off, a client certificate and key (file or data), a bearer token (inline or a file re-read as it rotates), basic
auth. A user who authenticates through an `exec` plugin or an `auth-provider` (cloud CLIs: EKS, GKE, AKS) is
loaded by the official client, imported then and only then (`pip install 'specpilot[exec-auth]'`), which also
refreshes that token.

In a pod (KUBERNETES_SERVICE_HOST set and no kubeconfig given): the service account's token, re-read every
minute (the kubelet rotates projected tokens), and its CA.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0
"""How often a token file is read again (client-go's figure): a rotated token is used within a minute."""


class ConfigError(Exception):
    """The kubeconfig (or the pod's service account) does not say how to reach and authenticate to a cluster."""


@dataclass
class Connection:
    """An API server and the credentials for it, loaded once per process."""

    server: str
    ca_path: str | None = None
    ca_data: str | None = None
    """PEM text of the CA (a kubeconfig's certificate-authority-data, decoded)."""
    insecure: bool = False
    cert_path: str | None = None
    cert_data: str | None = None
    key_path: str | None = None
    key_data: str | None = None
    token: str | None = None
    token_path: str | None = None
    """A file holding the token, read again every TOKEN_REREAD_S (a service account's projected token)."""
    username: str | None = None
    password: str | None = None
    proxy: str | None = None
    tls_server_name: str | None = None
    default_namespace: str | None = None
    refresh_token: Callable[[], str | None] | None = None
    """For exec plugins and auth-providers: the official client's way to a current token."""
    _token_read_at: float = field(default=-1e18, repr=False)

    @property
    def host(self) -> str:
        return self.server

    @classmethod
    def load(cls, kubeconfig: str | None = None, context: str | None = None) -> Connection:
        """From `kubeconfig` (else KUBECONFIG, else ~/.kube/config) and `context` (else its current-context);
        in a pod with none of those given, from the service account."""
        if kubeconfig or context or os.environ.get("KUBECONFIG") or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.from_kubeconfig(kubeconfig, context)
        return cls.in_cluster()

    @classmethod
    def in_cluster(cls, account: Path = SERVICE_ACCOUNT) -> Connection:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ConfigError("KUBERNETES_SERVICE_HOST is not set: not in a pod")
        token = account / "token"
        if not token.is_file():
            raise ConfigError(f"{token} is missing: the pod has no service account token mounted "
                              "(automountServiceAccountToken: false?)")
        host = f"[{host}]" if ":" in host else host
        namespace = account / "namespace"
        return cls(server=f"https://{host}:{port}", ca_path=str(account / "ca.crt"), token_path=str(token),
                   default_namespace=namespace.read_text().strip() if namespace.is_file() else None)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None, context: str | None = None) -> Connection:
        paths = [os.path.expanduser(p) for p in (kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config")
                 .split(os.pathsep) if p.strip()]
        current, contexts, clusters, users = _merged_kubeconfig(paths)
        name = context or current
        if not name:
            raise ConfigError(f"{os.pathsep.join(paths)} has no current-context: pass --context")
        if name not in contexts:
            raise ConfigError(f"context {name!r} is not in {os.pathsep.join(paths)} "
                              f"(it has: {', '.join(sorted(map(str, contexts))) or 'none'})")
        ctx = contexts[name]
        if ctx.get("cluster") not in clusters:
            raise ConfigError(f"context {name!r} names cluster {ctx.get('cluster')!r}, which is not defined")
        cluster, cluster_base = clusters[ctx["cluster"]]
        user, user_base = users.get(ctx.get("user"), ({}, Path.cwd()))
        if not cluster.get("server"):
            raise ConfigError(f"cluster {ctx['cluster']!r} has no server")

        def file(value: Any, base: Path) -> str | None:
            return None if not value else str(base / os.path.expanduser(value))

        def data_(value: Any) -> str | None:
            return base64.b64decode(value).decode() if value else None

        connection = cls(
            server=str(cluster["server"]).rstrip("/"),
            ca_path=file(cluster.get("certificate-authority"), cluster_base),
            ca_data=data_(cluster.get("certificate-authority-data")),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            tls_server_name=cluster.get("tls-server-name"),
            proxy=cluster.get("proxy-url"),
            cert_path=file(user.get("client-certificate"), user_base),
            cert_data=data_(user.get("client-certificate-data")),
            key_path=file(user.get("client-key"), user_base),
            key_data=data_(user.get("client-key-data")),
            token=user.get("token"),
            token_path=file(user.get("tokenFile"), user_base),
            username=user.get("username"),
            password=user.get("password"),
            default_namespace=ctx.get("namespace"),
        )
        if user.get("exec") or user.get("auth-provider"):
            connection.refresh_token = _official_client_token(paths, name)
        return connection

    def bearer(self) -> str | None:
        """The token to send now: a token file re-read once a minute, an exec plugin's refreshed."""
        if self.refresh_token is not None:
            return self.refresh_token()
        if self.token_path and time.monotonic() - self._token_read_at >= TOKEN_REREAD_S:
            try:
                self.token = Path(self.token_path).read_text().strip() or self.token
            except OSError:
                pass  # keep the last token: the kubelet writes the file anew, a read may race it
            self._token_read_at = time.monotonic()
        return self.token

    def headers(self) -> dict[str, str]:
        token = self.bearer()
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self.username and self.password:
            raw = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return {"Authorization": f"Basic {raw}"}
        return {}

    def ssl_context(self) -> ssl.SSLContext | bool:
        """What aiohttp's connector takes: False for plain http or verification off, else a context with the
        cluster's CA and the user's client certificate."""
        if not self.server.startswith("https://"):
            return False
        context = ssl.create_default_context(cafile=self.ca_path, cadata=self.ca_data)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_path or self.cert_data:
            with _as_files(self.cert_path, self.cert_data, self.key_path, self.key_data) as (cert, key):
                context.load_cert_chain(cert, key)
        return context


def _merged_kubeconfig(paths: list[str]) -> tuple[str | None, dict[str, dict], dict[str, tuple[dict, Path]],
                                                  dict[str, tuple[dict, Path]]]:
    """(current-context, contexts, clusters with their file's folder, users with theirs) of the files `paths`,
    merged as kubectl merges a KUBECONFIG list: the first file to set a name (or the current-context) wins."""
    current: str | None = None
    contexts: dict[str, dict] = {}
    clusters: dict[str, tuple[dict, Path]] = {}
    users: dict[str, tuple[dict, Path]] = {}
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            if len(paths) > 1:
                continue  # kubectl skips the absent files of a list
            raise ConfigError(f"{path} does not exist") from None
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{path} cannot be read as a kubeconfig: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} is not a kubeconfig (a YAML mapping)")
        base = Path(path).resolve().parent
        current = current or data.get("current-context")
        for item in data.get("contexts") or []:
            contexts.setdefault(item.get("name"), item.get("context") or {})
        for item in data.get("clusters") or []:
            clusters.setdefault(item.get("name"), (item.get("cluster") or {}, base))
        for item in data.get("users") or []:
            users.setdefault(item.get("name"), (item.get("user") or {}, base))
    return current, contexts, clusters, users


class _as_files:
    """ssl.load_cert_chain reads files only: PEM data goes through private temporary files, removed at once."""

    def __init__(self, cert_path: str | None, cert_data: str | None, key_path: str | None,
                 key_data: str | None) -> None:
        self.given = [(cert_path, cert_data), (key_path, key_data)]
        self.made: list[str] = []

    def __enter__(self) -> tuple[str, str | None]:
        paths: list[str | None] = []
        for path, data in self.given:
            if data:
                fd, path = tempfile.mkstemp(prefix="specpilot-tls-")  # mode 0600
                with os.fdopen(fd, "w") as f:
                    f.write(data)
                self.made.append(path)
            paths.append(path)
        return paths[0] or "", paths[1]

    def __exit__(self, *_: Any) -> None:
        for path in self.made:
            os.unlink(path)


def _official_client_token(paths: list[str], context: str) -> Callable[[], str | None]:
    """A token source for exec plugins and auth-providers, by the official client (imported only here)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise ConfigError(f"context {context!r} authenticates with an exec plugin or auth-provider, which needs "
                          "the official Kubernetes client: pip install 'specpilot[exec-auth]', or use a "
                          "kubeconfig with a token or a client certificate") from None
    configuration = client.Configuration()
    config.load_kube_config(config_file=os.pathsep.join(paths), context=context,
                            client_configuration=configuration)

    def token() -> str | None:
        if configuration.refresh_api_key_hook is not None:
            configuration.refresh_api_key_hook(configuration)
        value = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
        return value.removeprefix("Bearer ").strip() if value else None

    return token
