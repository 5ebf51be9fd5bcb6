"""The deployed gateways hand the KV over with ``kv_transfer_params`` (``--kv-handoff=params``):
the pods share no KV folder, and the workers speak NixlConnector's protocol (vLLM on GPUs in
production, the sim workers in dev). docs/deploy.md."""

from __future__ import annotations

import pytest

from tests.unit.deploy.test_manifests import OVERLAYS, by_kind, needs_kubectl, render, workers


@needs_kubectl
@pytest.mark.parametrize("target", OVERLAYS)
def test_gateways_pass_kv_transfer_params_and_workers_share_no_folder(target: str) -> None:
    objects = render(target)
    gateway = by_kind(objects, "Deployment")["goodput-gateway"]
    args = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--kv-handoff")] == ["--kv-handoff=params"]
    for deployment in workers(objects):
        worker_args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert not [a for a in worker_args if a.startswith("--kv-dir")], deployment["metadata"]
