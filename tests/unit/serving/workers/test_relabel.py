"""``set_role`` relabels the worker's pod: the agent against a scripted control plane
(httpx.MockTransport) and the fake Kubernetes API server on loopback (real HTTP).

The patch is a JSON merge patch of the pod's ``goodput.dev/role`` label; the command is
acknowledged done only after the API server took it, and failed, with the API server's
reason, when it refused (403: no right; 404: no pod) or could not be reached after bounded
retries. The worker's reported role changes only with the label.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from exporters.commands import Command, CommandKind
from exporters.fleet import PoolRole
from serving.kubernetes_api import KubernetesAPI, KubernetesError
from serving.workers import Agent, PodRelabeler
from tests.unit.serving.gateway.fake_kubernetes import FakeKubernetes, pod
from tests.unit.serving.workers.test_agent import MEMBER, SETTINGS, FakeControlPlane, Worker

pytestmark = pytest.mark.integration

PATCH_PATH = "/api/v1/namespaces/goodput/pods/w-1"


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    api = FakeKubernetes().start()
    api.put(pod("w-1", "prefill"))
    try:
        yield api
    finally:
        api.stop()


def relabeler(url: str, attempts: int = 3) -> PodRelabeler:
    return PodRelabeler(KubernetesAPI(url), namespace="goodput", pod="w-1", attempts=attempts,
                        backoff_s=0.01)  # fmt: skip


def set_role(role: str, version: int = 1) -> Command:
    return Command.new(CommandKind.SET_ROLE, MEMBER, {"role": role}, version=version,
                       now_ns=time.time_ns(), ttl_s=60)  # fmt: skip


def run_command(fake_url: str, command: Command, attempts: int = 3) -> tuple[Worker, Any]:
    """One agent step with ``command`` pending; the worker and the command's ack."""
    plane, worker = FakeControlPlane(commands=[command]), Worker()
    agent = Agent(SETTINGS, report=worker.report, apply=worker.apply,
                  relabeler=relabeler(fake_url, attempts),
                  transport=httpx.MockTransport(plane))  # fmt: skip
    try:
        agent.step()
    finally:
        agent.stop()
    (ack,) = plane.acks
    return worker, ack


def test_set_role_patches_the_label_then_acks_done(fake: FakeKubernetes) -> None:
    worker, ack = run_command(fake.url, set_role("decode"))

    assert fake.patches == [{
        "name": "w-1",
        "content_type": "application/merge-patch+json",
        "body": {"metadata": {"labels": {"goodput.dev/role": "decode"}}},
    }]  # fmt: skip
    assert fake.pods["w-1"]["metadata"]["labels"]["goodput.dev/role"] == "decode"
    assert ack["ok"] is True
    assert ack["detail"] == "done; pod w-1 labelled goodput.dev/role=decode"
    assert worker.role == "decode" and worker.applied == [CommandKind.SET_ROLE]


def test_a_forbidden_patch_acks_failed_with_the_reason(fake: FakeKubernetes) -> None:
    fake.patch_status = [403]

    worker, ack = run_command(fake.url, set_role("decode"))

    assert ack["ok"] is False
    assert ack["detail"] == (
        f"KubernetesError: PATCH {PATCH_PATH} (goodput.dev/role=decode) answered HTTP 403: "
        'pods "w-1" is forbidden: User "system:serviceaccount:goodput:goodput-worker" cannot '
        'patch resource "pods" in API group "" in the namespace "goodput" (Forbidden)'
    )
    assert len(fake.patches) == 1  # a missing right is not retried
    assert worker.role == "prefill" and worker.applied == []  # the role follows the label
    assert fake.pods["w-1"]["metadata"]["labels"]["goodput.dev/role"] == "prefill"


def test_a_missing_pod_acks_failed_with_the_reason(fake: FakeKubernetes) -> None:
    fake.pods.clear()

    worker, ack = run_command(fake.url, set_role("decode"))

    assert ack["ok"] is False
    assert ack["detail"].endswith('answered HTTP 404: pods "w-1" not found (NotFound)')
    assert worker.applied == []


def test_a_server_error_is_retried_within_the_bound(fake: FakeKubernetes) -> None:
    fake.patch_status = [500]

    relabeler(fake.url, attempts=2).set_role(PoolRole.BOTH)

    assert len(fake.patches) == 2
    assert fake.pods["w-1"]["metadata"]["labels"]["goodput.dev/role"] == "both"
    fake.patch_status = [503, 503]
    with pytest.raises(KubernetesError, match="answered HTTP 503: InternalError"):
        relabeler(fake.url, attempts=2).set_role(PoolRole.DECODE)


def test_an_unreachable_api_server_acks_failed_after_the_retries() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"

    worker, ack = run_command(url, set_role("decode"), attempts=3)

    assert ack["ok"] is False
    assert ack["detail"].startswith(
        f"KubernetesError: PATCH {PATCH_PATH} (goodput.dev/role=decode) failed: ConnectError"
    )
    assert worker.applied == []


def test_the_service_account_token_is_sent(fake: FakeKubernetes, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    relabel = PodRelabeler(KubernetesAPI(fake.url, token_file=token), namespace="goodput",
                           pod="w-1")  # fmt: skip
    relabel.set_role(PoolRole.DECODE)
    token.write_text("tok-2\n")  # kubelet rotated it
    relabel.set_role(PoolRole.PREFILL)
    relabel.close()

    assert [h["Authorization"] for h in fake.headers] == ["Bearer tok-1", "Bearer tok-2"]


def test_pod_and_namespace_are_required() -> None:
    with pytest.raises(ValueError, match="namespace and pod must be non-empty, got 'goodput'"):
        PodRelabeler(KubernetesAPI("http://127.0.0.1:1"), namespace="goodput", pod="")
