"""Test-session wide hooks.

Playwright's sync API (pytest-playwright's session-scoped ``playwright`` fixture) keeps an
event loop running in the main thread from the first browser test to the end of the run, so
a later test that calls ``asyncio.run`` there fails with "cannot be called from a running
event loop". The browser tests therefore run last, after every other tier, in the order
pytest chose for them.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def uses_playwright(item: pytest.Item) -> bool:
        params = getattr(getattr(item, "callspec", None), "params", {})
        return "browser_name" in params or "browser_name" in getattr(item, "fixturenames", ())

    items[:] = [i for i in items if not uses_playwright(i)] + [
        i for i in items if uses_playwright(i)
    ]
