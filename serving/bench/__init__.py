"""``goodput bench``: open-loop replay of a request trace against an OpenAI-compatible server,
with prompts of exact token counts and every metric from the exporters' metric core.
See docs/gateway.md."""

from serving.bench.prompts import PromptFactory, RequestPlan, plan_requests
from serving.bench.report import parse_slo, per_request, summarize
from serving.bench.runner import BenchRun, run_plan, stream_request

__all__ = [
    "BenchRun",
    "PromptFactory",
    "RequestPlan",
    "parse_slo",
    "per_request",
    "plan_requests",
    "run_plan",
    "stream_request",
    "summarize",
]
