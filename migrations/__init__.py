"""Alembic environment and revisions for the Goodput registry.

The helpers here build an Alembic ``Config`` that finds this folder from any working
directory (the CLI's ``goodput db upgrade`` and the tests use them)::

    from migrations import upgrade
    upgrade("postgresql+psycopg://goodput@db/goodput")
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

__all__ = ["HERE", "alembic_config", "downgrade", "head_revision", "upgrade"]

HERE = Path(__file__).resolve().parent


def alembic_config(database_url: str | None = None) -> Config:
    """A Config for this folder; ``database_url`` (sync or async form) overrides the settings'.

    The URL travels in ``config.attributes``, not the ini options, so percent signs in it
    (``?options=-csearch_path%3D...``) need no configparser escaping.
    """
    config = Config(str(HERE / "alembic.ini"))
    config.set_main_option("script_location", str(HERE))
    if database_url is not None:
        config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no Alembic revisions under {HERE / 'versions'}")
    return head
