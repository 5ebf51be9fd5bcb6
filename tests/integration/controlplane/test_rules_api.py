"""Rule files over HTTP on both backends: an SLO that cannot be alerted on is a 409 from its
own file (the request is valid; the stored SLO is what cannot be paged on) and a comment in
the file for all SLOs, which still serves the others."""

from __future__ import annotations

import httpx
import pytest
import yaml

pytestmark = pytest.mark.integration


def slo(name: str, window_s: int) -> dict[str, object]:
    return {
        "name": name,
        "objectives": [{"metric": "ttft", "threshold_s": 0.2}],
        "target": 0.99,
        "window_s": window_s,
    }


async def test_an_slo_too_short_to_page_on_is_409_and_named_in_the_shared_file(
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    viewer_headers: dict[str, str],
) -> None:
    for body in (slo("short", 600), slo("chat", 86_400)):
        created = await client.post("/api/v1/slos", json=body, headers=operator_headers)
        assert created.status_code == 201, created.text

    refused = await client.get("/api/v1/slos/short/prometheus-rules", headers=viewer_headers)
    assert refused.status_code == 409, refused.text
    assert "slo 'short': window_s must be >= 3600" in refused.text

    own = await client.get("/api/v1/slos/chat/prometheus-rules", headers=viewer_headers)
    assert own.status_code == 200, own.text
    assert yaml.safe_load(own.text)["groups"]

    shared = await client.get("/api/v1/prometheus/rules", headers=viewer_headers)
    assert shared.status_code == 200, shared.text
    assert "# not alerted on: slo 'short': window_s must be >= 3600" in shared.text
    assert yaml.safe_load(shared.text)["groups"]
