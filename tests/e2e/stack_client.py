"""What the e2e stacks' fixtures share: calls to the control plane with a role's key, and a
check that every child process still runs."""

from __future__ import annotations

from typing import Any

import httpx

from goodput._demo_processes import ChildProcess


class StackClient:
    """Mixed into a stack dataclass that has ``cp_url``, ``keys`` (role → API key) and
    ``children``."""

    cp_url: str
    keys: dict[str, str]
    children: list[ChildProcess]

    def headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}

    def get(self, path: str, role: str = "viewer", **params: Any) -> Any:
        response = httpx.get(
            f"{self.cp_url}{path}", params=params, headers=self.headers(role), timeout=10
        )
        assert response.status_code == 200, response.text
        return response.json()

    def post(self, path: str, body: dict[str, Any], role: str = "operator") -> Any:
        response = httpx.post(
            f"{self.cp_url}{path}", json=body, headers=self.headers(role), timeout=10
        )
        assert response.status_code in (200, 201), response.text
        return response.json()

    def check_alive(self) -> None:
        for child in self.children:
            assert child.alive(), f"{child.log_path} exited:\n{child.log_tail()}"
