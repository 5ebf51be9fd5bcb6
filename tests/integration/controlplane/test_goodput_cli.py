"""The ``goodput`` CLI through typer's CliRunner, on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from controlplane.db import sync_url
from controlplane.models import APIKey, AuditLog, Base
from controlplane.services.keys import hash_key
from goodput.cli import app

pytestmark = pytest.mark.integration

SLOS_YAML = """\
name: chat
selector: {model: llama}
objectives:
  - {metric: ttft, threshold_s: 0.2}
  - {metric: itl, threshold_s: 0.05, statistic: p99}
target: 0.99
---
apiVersion: openslo/v1
kind: SLO
metadata: {name: batch}
spec:
  budgetingMethod: Occurrences
  timeWindow: [{duration: 1d, isRolling: true}]
  indicator:
    spec:
      thresholdMetric:
        metricSource: {type: Goodput, spec: {metric: e2el}}
  objectives: [{op: lte, value: 30, target: 0.9}]
"""


@pytest.fixture
def db(database_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(sync_url(database_url))
    yield engine
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


def run(database_url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["--database-url", database_url, *args])
    return result.exit_code, result.stdout, result.stderr


def test_create_key_prints_it_once_and_audits_as_cli(database_url: str, db: sa.Engine) -> None:
    code, out, err = run(database_url, "admin", "create-key", "--role", "admin", "--name", "root")
    assert code == 0, err
    key = out.strip()
    assert key.startswith("gp_")
    assert "store it now" in err
    assert key not in err
    with db.connect() as conn:
        stored = conn.execute(sa.select(APIKey.hash, APIKey.role, APIKey.name)).one()
        actors = conn.execute(sa.select(AuditLog.actor, AuditLog.action)).all()
    assert tuple(stored) == (hash_key(key), "admin", "root")
    assert [tuple(a) for a in actors] == [("cli", "key.create")]


def test_create_key_rejects_unknown_role(database_url: str, db: sa.Engine) -> None:
    code, _, err = run(database_url, "admin", "create-key", "--role", "root")
    assert code == 2
    assert "root" in err


def test_slo_apply_creates_then_updates_by_name(
    database_url: str, db: sa.Engine, tmp_path: Path
) -> None:
    path = tmp_path / "slos.yaml"
    path.write_text(SLOS_YAML)
    code, out, err = run(database_url, "slo", "apply", "-f", str(path))
    assert code == 0, err
    assert out.splitlines() == ["created chat (version 1)", "created batch (version 1)"]
    code, out, _ = run(database_url, "slo", "apply", "-f", str(path))
    assert out.splitlines() == ["unchanged chat (version 1)", "unchanged batch (version 1)"]
    path.write_text(SLOS_YAML.replace("target: 0.99", "target: 0.95"))
    code, out, _ = run(database_url, "slo", "apply", "-f", str(path))
    assert out.splitlines() == ["updated chat (version 2)", "unchanged batch (version 1)"]
    code, out, _ = run(database_url, "slo", "list")
    assert code == 0
    assert out.splitlines() == [
        "batch\tv1\ttarget=0.9\twindow=1d\te2el<=30s",
        "chat\tv2\ttarget=0.95\twindow=28d\tttft<=0.2s, itl:p99<=0.05s",
    ]


def test_slo_apply_reports_invalid_file_and_writes_nothing(
    database_url: str, db: sa.Engine, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(SLOS_YAML.replace("value: 30", "value: -30"))
    code, out, err = run(database_url, "slo", "apply", "-f", str(path))
    assert code == 2
    assert out == ""
    assert err.strip() == (
        "error: documents[1].objectives[0].threshold_s must be in (0, 3600], got -30"
    )
    code, out, err = run(database_url, "slo", "list")
    assert (out, err.strip()) == ("", "no SLOs")


def test_db_upgrade_creates_a_fresh_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'var' / 'goodput.db'}"
    code, _, err = run(url, "db", "upgrade")
    assert code == 0, err
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert "slo" in sa.inspect(conn).get_table_names()
    engine.dispose()
