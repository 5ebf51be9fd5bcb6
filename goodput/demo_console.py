"""The console lines of ``goodput demo``: one-time sign-in links minted over the API (shared
by the replay demo and the stack demo)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from goodput._demo_processes import DemoError

__all__ = ["sign_in_links"]


def sign_in_links(client: httpx.Client, keys: Mapping[str, str]) -> list[str]:
    """One console line per role: a one-time sign-in link minted with that role's key."""
    lines = []
    for role, key in keys.items():
        response = client.post(
            "/api/v1/sessions/links", json={}, headers={"Authorization": f"Bearer {key}"}
        )
        if response.status_code != 201:
            raise DemoError(f"minting a sign-in link answered HTTP {response.status_code}")
        lines.append(f"  sign in as {role} (once): {client.base_url}{response.json()['path']}")
    return lines
