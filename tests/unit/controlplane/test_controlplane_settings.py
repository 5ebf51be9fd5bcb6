"""Settings come from GOODPUT_* variables and are validated with clear messages."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from controlplane.settings import DEFAULT_DATABASE_URL, Settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("GOODPUT_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    settings = Settings()
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert (settings.open_health, settings.open_metrics) == (True, True)
    assert settings.rollup_interval_s == 60


def test_environment_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODPUT_DATABASE_URL", "postgresql://goodput@db/goodput")
    monkeypatch.setenv("GOODPUT_OPEN_METRICS", "false")
    monkeypatch.setenv("GOODPUT_LOG_LEVEL", "debug")
    monkeypatch.setenv("DATABASE_URL", "sqlite:///ignored.db")
    settings = Settings()
    assert settings.database_url == "postgresql://goodput@db/goodput"
    assert settings.open_metrics is False
    assert settings.log_level == "DEBUG"
    assert settings.log_level_number == 10


def test_unknown_database_is_refused() -> None:
    with pytest.raises(
        ValidationError, match="database_url must be a sqlite:// or postgresql:// URL, got 'mysql'"
    ):
        Settings(database_url="mysql://x/y")
