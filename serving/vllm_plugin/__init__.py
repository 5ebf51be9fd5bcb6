"""The engine-side exporter: a vLLM stat-logger plugin that ships request records.

The plugin class is :class:`serving.vllm_plugin.stat_logger.GoodputStatLogger` (it imports
vLLM, so it is not imported here); the record building it relies on is pure and lives in
:mod:`serving.vllm_plugin.records`. See docs/serving.md for configuration and for how
engine records join gateway records (``X-Request-Id``).
"""

from serving.vllm_plugin.records import (
    BuilderStats,
    EngineRecordBuilder,
    FinishedStats,
    gateway_request_id,
    status_of,
)

__all__ = [
    "BuilderStats",
    "EngineRecordBuilder",
    "FinishedStats",
    "gateway_request_id",
    "status_of",
]
