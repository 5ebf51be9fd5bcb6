"""Goodput exporters: the wire contract, the per-token recorder and its transports.

This package never imports FastAPI or the control plane: the serving stack embeds it, and
the control plane consumes what it ships. Registries and providers are passed in, never global.
"""

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

__all__ = [
    "LABEL_KEYS",
    "NUM_PHASES",
    "LabelColumn",
    "Labels",
    "Phase",
    "RecordBatch",
    "RecordError",
    "RequestRecord",
    "Status",
    "TokenDetail",
    "Vantage",
]
