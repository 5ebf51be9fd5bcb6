"""The control plane's one configuration object, read from ``GOODPUT_*`` environment variables.

Nothing else in the control plane reads ``os.environ``: components receive the
:class:`Settings` instance (``create_app(settings)``, ``request.app.state.settings``).

Example::

    settings = Settings(database_url="postgresql+psycopg://goodput@db/goodput", port=8000)
    app = create_app(settings)
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

__all__ = ["DEFAULT_DATABASE_URL", "Settings"]

DEFAULT_DATABASE_URL = "sqlite:///./var/goodput.db"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class Settings(BaseSettings):
    """Control-plane settings; every field can be set as ``GOODPUT_<FIELD>`` (case-insensitive).

    ``database_url`` is a SQLAlchemy URL: the embedded default is a SQLite file (its folder is
    created on first use); production uses ``postgresql+psycopg://user@host/db``. Plain
    ``sqlite://`` / ``postgresql://`` URLs are accepted and given their async driver.
    ``open_health`` / ``open_metrics`` serve ``/health`` and ``/metrics`` without a key (for
    load balancers and Prometheus); when false they need a viewer key.
    ``max_ingest_bytes`` bounds an ingest or OTLP body (before and after gzip);
    ``max_request_bytes`` every other body (``max_import_bytes`` an SLO import's),
    ``max_header_bytes`` the request headers; a handler that has not answered within
    ``request_timeout_s`` is a 503; ``auth_failures_per_s`` / ``auth_failure_burst`` and
    ``admin_requests_per_s`` / ``admin_burst`` are the rate limits (docs/api.md, *Limits*);
    ``ingest_dedup_window`` / ``ingest_max_exporters`` bound batch de-duplication;
    ``durable_ingest``: acknowledge a batch only once it is in the write-ahead log on disk
    (``wal_fsync``), in ``wal_dir`` (default: beside a SQLite file, else
    ``var/wal/<digest of the database URL>``; see :meth:`wal_path`);
    ``slo_poll_interval_s`` is how often the live engine looks for SLO changes;
    ``slo_cache_ttl_s`` how long a goodput query trusts the database's answer to which SLO
    a name means (an SLO changed through another replica is seen within it; 0: no cache;
    ``controlplane.services.slos_cache``);
    ``database_retry_max_s`` caps the backoff (from 0.5 s, doubling) between its attempts to
    load the SLO set while the database is down or not migrated;
    ``dry_run_max_rows`` caps the rows kept for SLO dry runs (about 100 bytes each).
    ``malloc_mmap_threshold``: ``serve`` fixes glibc's mmap threshold at this many bytes,
    and its trim threshold at twice it (``controlplane.allocator``; 0: glibc's dynamic
    default; an operator's ``MALLOC_MMAP_THRESHOLD_`` is kept);
    ``malloc_trim_interval_s``: ``serve`` calls glibc's ``malloc_trim`` this often, which
    keeps RSS bounded with the heap holding the ingest batches' arrays (0: never).
    ``otlp_grpc_port`` / ``otlp_grpc_host``: the OTLP/gRPC trace receiver's address (off
    unless the port is set: 4317 is OTLP's; 0 picks a free one; the host defaults to
    ``host``).
    ``fleet_ingest``: replicas on one PostgreSQL database share ingest through its fleet
    log, and each counts every replica's batches (``fleet_read_interval_s``: how often it
    reads the log; docs/scale-out.md).
    ``planner_*``: the PD planner tick (on by default, every ``planner_interval_s``), its
    demand window, hysteresis, dwell time, moves per tick, and its role moves' command
    validity, drain timeout and when their effect is observed (docs/planner.md).
    ``admission_*``: the admission policy pushed to every gateway (on by default, every
    ``admission_interval_s``), its TTL at the gateways and fallback concurrency cap, and
    the window of the burn rates that tighten it (docs/admission.md).
    """

    model_config = SettingsConfigDict(env_prefix="GOODPUT_", extra="ignore", frozen=True)

    database_url: str = DEFAULT_DATABASE_URL
    database_echo: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    open_metrics: bool = True
    open_health: bool = True
    rollup_interval_s: float = Field(default=60.0, gt=0)
    fleet_heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    key_last_used_resolution_s: float = Field(default=60.0, ge=0)
    # How long a key revoked through another process keeps working here (docs/api.md).
    key_cache_ttl_s: float = Field(default=5.0, ge=0)
    ready_timeout_s: float = Field(default=2.0, gt=0)
    max_import_bytes: int = Field(default=1_048_576, gt=0)
    # Limits before work (controlplane.api.limits): any other route's body, the request
    # headers, and how long a handler may take to start its response.
    max_request_bytes: int = Field(default=1_048_576, gt=0)
    max_header_bytes: int = Field(default=16_384, gt=0)
    request_timeout_s: float = Field(default=30.0, gt=0)
    auth_failures_per_s: float = Field(default=10.0, gt=0)
    auth_failure_burst: int = Field(default=100, ge=1)
    admin_requests_per_s: float = Field(default=100.0, gt=0)
    admin_burst: int = Field(default=200, ge=1)
    # Ingest and the live goodput engine (docs/ingest.md).
    max_ingest_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    ingest_dedup_window: int = Field(default=1024, ge=1, le=65_536)
    ingest_max_exporters: int = Field(default=100_000, ge=1)
    slo_poll_interval_s: float = Field(default=1.0, gt=0)
    # How long an SLO changed through another process keeps its old reference in a goodput
    # query here (docs/api.md, *Caching*).
    slo_cache_ttl_s: float = Field(default=1.0, ge=0, le=3600)
    # Durable acknowledgement: the ingest write-ahead log (docs/goodput-engine.md).
    durable_ingest: bool = True
    wal_dir: str | None = None
    wal_fsync: bool = True
    database_retry_max_s: float = Field(default=30.0, gt=0)
    # OTLP/gRPC trace receiver (docs/ingest.md); None: off. Needs grpcio (the grpc extra).
    otlp_grpc_port: int | None = Field(default=None, ge=0, le=65535)
    otlp_grpc_host: str | None = None
    goodput_stream_interval_s: float = Field(default=1.0, gt=0)
    dry_run_max_rows: int = Field(default=1_000_000, ge=1)
    # glibc's mmap threshold, fixed at start-up (docs/goodput-engine.md, *Soak*); 0: off.
    # 32 MiB, glibc's largest: every ingest temporary comes from the heap (no page faults).
    malloc_mmap_threshold: int = Field(default=32 * 2**20, ge=0, le=32 * 2**20)
    # glibc's malloc_trim every this many seconds (controlplane/allocator.py); 0: never.
    malloc_trim_interval_s: float = Field(default=5.0, ge=0)
    # Replicas sharing one database elect one to run the loops (docs/scale-out.md).
    replica_id: str | None = Field(default=None, min_length=1, max_length=255)
    # Replicas that share ingest: every batch goes through the database's fleet log and
    # every replica counts every batch (docs/scale-out.md). Needs PostgreSQL.
    fleet_ingest: bool = False
    fleet_read_interval_s: float = Field(default=0.05, gt=0, le=10)
    leader_lease_ttl_s: float = Field(default=6.0, gt=0, le=3600)
    # The PD planner tick (docs/planner.md).
    planner_enabled: bool = True
    planner_interval_s: float = Field(default=5.0, gt=0)
    planner_window_s: float = Field(default=60.0, gt=0)
    planner_min_gain_ratio: float = Field(default=0.05, ge=0)
    planner_min_dwell_s: float = Field(default=60.0, ge=0)
    planner_max_moves_per_tick: int = Field(default=1, ge=1)
    planner_command_ttl_s: float = Field(default=120.0, gt=0, le=86_400)
    planner_drain_timeout_s: float = Field(default=120.0, gt=0)
    planner_observe_after_s: float = Field(default=60.0, gt=0)
    # Admission policies pushed to gateways (docs/admission.md).
    admission_enabled: bool = True
    admission_interval_s: float = Field(default=10.0, gt=0)
    admission_policy_ttl_s: float = Field(default=30.0, gt=0, le=86_400)
    admission_fallback_max_concurrency: int = Field(default=256, ge=1, le=2**31 - 1)
    admission_burn_window_s: float = Field(default=300.0, gt=0)
    # Console sign-in sessions (docs/console.md).
    console_session_ttl_s: float = Field(default=8 * 3600.0, gt=0, le=30 * 86_400)
    log_level: LogLevel = "INFO"
    log_json: bool = False

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _fleet_needs_postgresql(self) -> Settings:
        if self.fleet_ingest and not self.database_url.startswith("postgresql"):
            raise ValueError(
                "fleet_ingest needs a postgresql:// database_url (replicas share its log)"
            )
        return self

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if not value.startswith(("sqlite", "postgresql")):
            scheme = value.split(":", maxsplit=1)[0]
            raise ValueError(
                f"database_url must be a sqlite:// or postgresql:// URL, got {scheme!r}"
            )
        return value

    def wal_path(self) -> Path | None:
        """The write-ahead log's folder, ``None`` when ingest is not durable (or the
        database is in memory, whose history a restart loses anyway)."""
        if not self.durable_ingest:
            return None
        if self.wal_dir:
            return Path(self.wal_dir)
        url = make_url(self.database_url)
        if url.get_backend_name() == "sqlite":
            database = url.database or ""
            if database in ("", ":memory:") or database.startswith("file::memory:"):
                return None
            return Path(f"{database}.wal.d")
        digest = hashlib.sha256(self.database_url.encode()).hexdigest()[:16]
        return Path("var") / "wal" / digest

    @property
    def log_level_number(self) -> int:
        return logging.getLevelNamesMapping()[self.log_level]
