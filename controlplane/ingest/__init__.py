"""Ingest: record batches and OTLP traces from the network into the goodput engine.

* :mod:`~controlplane.ingest.dedup`: ``(exporter_id, seq)`` de-duplication, bounded;
* :mod:`~controlplane.ingest.ingestor`: de-duplicate, apply whole, count (Prometheus);
* :mod:`~controlplane.ingest.body`: size-limited (gzip-aware) request bodies;
* :mod:`~controlplane.ingest.otlp`: OTLP ``llm_request`` spans → request records;
  :mod:`~controlplane.ingest.otlp_codec`: OTLP/HTTP request and response bodies.

The HTTP routes are in ``controlplane.api.routes.ingest`` and ``...otlp``; ``docs/ingest.md``
has the contract and its limits.
"""

from controlplane.ingest.body import MalformedBodyError, read_limited
from controlplane.ingest.dedup import Deduplicator, DedupStats, SeqVerdict
from controlplane.ingest.ingestor import (
    IngestCollector,
    IngestFailedError,
    Ingestor,
    IngestOutcome,
    StaleBatchError,
    TenantScopeError,
    check_tenant,
)
from controlplane.ingest.otlp import SpanMapping, map_spans
from controlplane.ingest.otlp_codec import (
    OtlpDecodeError,
    export_response,
    parse_export_request,
    rpc_status,
)

__all__ = [
    "DedupStats",
    "Deduplicator",
    "IngestCollector",
    "IngestFailedError",
    "IngestOutcome",
    "Ingestor",
    "MalformedBodyError",
    "OtlpDecodeError",
    "SeqVerdict",
    "SpanMapping",
    "StaleBatchError",
    "TenantScopeError",
    "check_tenant",
    "export_response",
    "map_spans",
    "parse_export_request",
    "read_limited",
    "rpc_status",
]
