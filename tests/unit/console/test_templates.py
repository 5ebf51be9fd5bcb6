"""The console's templates rendered without a server: the empty states say what to do
next, a viewer's frame has no mutation control, and no page carries an inline script,
handler or style (the CSP is ``default-src 'self'``)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from controlplane.api.sessions import OpenSession
from controlplane.console.pages import HERE, frame, templates
from controlplane.models import KeyRole

PAGES = ["overview", "slo", "editor", "fleet", "control", "audit", "keys"]


def render(
    template: str, role: KeyRole = KeyRole.VIEWER, tenant: str | None = None, **context: Any
) -> str:
    me = OpenSession(uuid.uuid4(), f"k-{role.value}", role, tenant, "csrf123", datetime.now(UTC))
    request = SimpleNamespace(base_url="http://cp.example:8000/")
    return templates.get_template(template).render(
        request=request,
        **frame(me),
        params={"ref": "chat"},
        title="t",
        **context,
    )


def test_overview_without_slos_says_how_to_apply_one_and_point_an_exporter() -> None:
    html = render("overview.html")
    empty = html[html.index('id="empty"') : html.index("</div>", html.index('id="empty"'))]
    assert "No SLO yet" in empty
    assert "goodput slo apply examples/slos.yaml" in empty
    assert "--control-plane http://cp.example:8000/" in empty
    assert "create one here" not in empty  # a viewer cannot
    assert "create one here" in render("overview.html", KeyRole.OPERATOR)
    assert "No request judged in the last 6 hours" in html


def test_other_empty_states() -> None:
    control = render("control.html")
    assert "No admission policy issued yet" in control
    assert "No role move yet" in control
    assert "No SLO yet: goodput is drawn per SLO" in control
    assert "records no observed\n  effect per decision" in control


def test_a_viewer_gets_no_mutation_control() -> None:
    viewer = render("overview.html")
    assert "New SLO" not in viewer and "API keys" not in viewer
    operator = render("overview.html", KeyRole.OPERATOR)
    assert "New SLO" in operator and "API keys" not in operator
    assert "API keys" in render("overview.html", KeyRole.ADMIN)
    slo = render("slo.html")
    assert 'id="edit"' not in slo and 'id="export"' in slo


def test_pausing_the_automation_is_offered_to_cluster_operators_only() -> None:
    assert 'id="pause"' in render("fleet.html", KeyRole.OPERATOR)
    assert 'id="pause"' in render("fleet.html", KeyRole.ADMIN)
    tenant_operator = render("fleet.html", KeyRole.OPERATOR, tenant="acme")
    assert 'id="pause"' not in tenant_operator and 'id="resume"' not in tenant_operator
    assert '<th scope="col">Actions</th>' in tenant_operator  # its own members' actions
    assert 'id="pause"' not in render("fleet.html")


def test_csrf_token_is_in_the_page_and_the_sign_out_form() -> None:
    html = render("fleet.html")
    assert '<meta name="csrf-token" content="csrf123">' in html
    assert '<input type="hidden" name="csrf_token" value="csrf123">' in html


@pytest.mark.parametrize("page", PAGES)
def test_no_inline_script_handler_or_style(page: str) -> None:
    html = render(f"{page}.html", KeyRole.ADMIN)
    scripts = re.findall(r"<script\b[^>]*>", html)
    assert scripts and all(" src=" in s for s in scripts), scripts
    assert not re.search(r"\son[a-z]+=", html)
    assert not re.search(r"\sstyle=", html)


def test_every_page_module_exists() -> None:
    for page in PAGES:
        html = render(f"{page}.html", KeyRole.ADMIN)
        for src in re.findall(r'<script[^>]* src="/console/static/([^"]+)"', html):
            if not src.startswith("vendor/"):  # built by make install
                assert (HERE / "static" / src).is_file(), src
