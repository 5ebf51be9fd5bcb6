"""Where the Kubernetes API server is and how to authenticate to it (shared by the gateway's
pod watch and the worker's relabelling; no gateway or worker import).

:class:`KubernetesAPI` holds the URL, the bearer token's file and the CA:
:meth:`KubernetesAPI.in_cluster` reads the service account's token, CA and namespace
(``/var/run/secrets/kubernetes.io/serviceaccount``) and ``KUBERNETES_SERVICE_HOST`` /
``KUBERNETES_SERVICE_PORT``; the token is read again at every call that asks for it (kubelet
rotates it). An explicit URL without a token is for ``kubectl proxy`` and tests.

Example::

    api = KubernetesAPI.in_cluster()
    client = httpx.Client(base_url=api.url, verify=api.verify(), headers=api.headers())
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ROLE_LABEL",
    "SERVICE_ACCOUNT",
    "KubernetesAPI",
    "KubernetesError",
    "in_cluster_namespace",
]

ROLE_LABEL = "goodput.dev/role"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubernetesError(RuntimeError):
    """The API server cannot be reached or used as configured; the message says why."""


@dataclass(frozen=True, slots=True)
class KubernetesAPI:
    """Where the API server is (``url``), how to trust it (``ca_file``; ``None``: the
    system's CAs) and the file of the bearer token (``None``: no token)."""

    url: str
    token_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] | None = None) -> KubernetesAPI:
        env = os.environ if environ is None else environ
        host = env.get("KUBERNETES_SERVICE_HOST")
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubernetesError(
                "KUBERNETES_SERVICE_HOST is not set: not running in a pod; give the API "
                "server's URL (--kubernetes-api), or run a gateway with --pools-from=fleet "
                "and a worker without --kubernetes-relabel"
            )
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", SERVICE_ACCOUNT / "token", SERVICE_ACCOUNT / "ca.crt")

    def token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            return self.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KubernetesError(f"cannot read the service-account token: {exc}") from None

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header with the current token (none without a token)."""
        token = self.token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def verify(self) -> ssl.SSLContext | bool:
        if self.ca_file is None:
            return True
        try:
            return ssl.create_default_context(cafile=str(self.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise KubernetesError(f"cannot read the cluster CA {self.ca_file}: {exc}") from None


def in_cluster_namespace() -> str:
    """The pod's namespace from its service account (the downward API's is preferred)."""
    try:
        return (SERVICE_ACCOUNT / "namespace").read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise KubernetesError(
            f"no namespace given and none readable from the service account: {exc}"
        ) from None
