"""Goodput exporters: the wire contract, the exact metric core, the per-token recorder.

This package never imports FastAPI or the control plane: the serving stack embeds it, and
the control plane consumes what it ships. Registries and providers are passed in, never
global. The transports with heavier dependencies are imported from their modules:
``exporters.transport.ControlPlaneExporter`` (httpx), ``exporters.prometheus.PrometheusExporter``
(prometheus-client) and ``exporters.otel.OTelExporter`` (OpenTelemetry SDK).
"""

from exporters.commands import (
    AdmissionPolicy,
    ClassPolicy,
    Command,
    CommandAck,
    CommandError,
    CommandKind,
    Pool,
    command_from_json,
    command_to_json,
    pending_commands_from_json,
)
from exporters.fleet import (
    FleetError,
    FleetHeartbeat,
    FleetKind,
    FleetMember,
    FleetPage,
    FleetRegister,
    FleetState,
    PoolRole,
)
from exporters.latency import (
    ItlGroups,
    RequestLatencies,
    itl_gaps_s,
    itl_gaps_us,
    itl_percentile_s,
    request_latencies,
)
from exporters.recorder import RecorderStats, RequestRecorder, RequestTrace
from exporters.records import (
    LABEL_KEYS,
    NUM_PHASES,
    LabelColumn,
    Labels,
    Phase,
    RecordBatch,
    RecordError,
    RequestRecord,
    Status,
    TokenDetail,
    Vantage,
)
from exporters.sinks import FanoutSink, InMemorySink, RecordSink
from exporters.sketch import LatencySketch, SketchError
from exporters.slo import Metric, Objective, SLOError, Verdicts, judge
from exporters.wire import (
    CONTENT_TYPE_BINARY,
    CONTENT_TYPE_JSON,
    WIRE_VERSION,
    BatchHeader,
    WireError,
    batch_from_json,
    batch_to_json,
    decode_any,
    decode_batch,
    encode_batch,
)

__all__ = [
    "CONTENT_TYPE_BINARY",
    "CONTENT_TYPE_JSON",
    "LABEL_KEYS",
    "NUM_PHASES",
    "WIRE_VERSION",
    "AdmissionPolicy",
    "BatchHeader",
    "ClassPolicy",
    "Command",
    "CommandAck",
    "CommandError",
    "CommandKind",
    "FanoutSink",
    "FleetError",
    "FleetHeartbeat",
    "FleetKind",
    "FleetMember",
    "FleetPage",
    "FleetRegister",
    "FleetState",
    "InMemorySink",
    "ItlGroups",
    "LabelColumn",
    "Labels",
    "LatencySketch",
    "Metric",
    "Objective",
    "Phase",
    "Pool",
    "PoolRole",
    "RecordBatch",
    "RecordError",
    "RecordSink",
    "RecorderStats",
    "RequestLatencies",
    "RequestRecord",
    "RequestRecorder",
    "RequestTrace",
    "SLOError",
    "SketchError",
    "Status",
    "TokenDetail",
    "Vantage",
    "Verdicts",
    "WireError",
    "batch_from_json",
    "batch_to_json",
    "command_from_json",
    "command_to_json",
    "decode_any",
    "decode_batch",
    "encode_batch",
    "itl_gaps_s",
    "itl_gaps_us",
    "itl_percentile_s",
    "judge",
    "pending_commands_from_json",
    "request_latencies",
]
