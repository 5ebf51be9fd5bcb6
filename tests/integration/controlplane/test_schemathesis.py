"""Property-based API tests from the OpenAPI schema (schemathesis) over every route, with an
admin key: no 5xx, every response conforms to the schema (status codes, content types,
headers, bodies), schema-invalid input is rejected and schema-valid input is accepted. The
key goes through Schemathesis' auth hook, so the cases it generates without one (to check
that they are refused) are sent without one.

Binary bodies are generated as real messages by strategies registered for their media types
(a wire batch in msgpack, an OTLP ``ExportTraceServiceRequest`` in protobuf), so the ingest
routes are fuzzed with what they accept, not only with random bytes.

Left out, and why:

* ``GET /api/v1/goodput/stream`` and ``GET /api/v1/goodput/summary/stream``: Server-Sent
  Events streams that end only when the client leaves or the app stops, so a generated call
  with a valid key reads one forever (the summary stream was fuzzed until a change of the
  schema made Hypothesis draw such a call, and the test hung). ``test_goodput_stream.py`` and
  the console's tests cover their events, disconnects and shutdown over real HTTP; their
  other answers (401, 403, 422, 503) come from the dependencies every route shares.
* The *acceptance* check only for JSON batches at ``POST /api/v1/ingest``: the batch's rules
  across fields (every column holds one entry per request id, emission times rise) are
  beyond JSON Schema, so a schema-valid JSON batch is almost never a valid batch; the route
  answers 422 naming the field. Every other check runs on it, and binary batches (valid by
  construction) are checked for acceptance too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import schemathesis
import sqlalchemy as sa
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from schemathesis.core.result import Ok
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import positive_data_acceptance
from sqlalchemy.orm import Session

from controlplane.db import sync_url
from controlplane.ingest.otlp_codec import CONTENT_TYPE_PROTOBUF
from controlplane.main import create_app
from controlplane.models import APIKey, Base, KeyRole
from controlplane.services import keys as key_service
from controlplane.settings import Settings
from exporters.records import Labels, RecordBatch, RequestRecord, Status, TokenDetail, Vantage
from exporters.wire import CONTENT_TYPE_BINARY, CONTENT_TYPE_JSON, encode_batch

pytestmark = pytest.mark.integration

STREAM = "/api/v1/goodput/stream"
SUMMARY_STREAM = "/api/v1/goodput/summary/stream"
STREAMS = f"^({STREAM}|{SUMMARY_STREAM})$"
INGEST = "/api/v1/ingest"


@st.composite
def _records(draw: st.DrawFn, index: int, now_ns: int) -> RequestRecord:
    num = draw(st.integers(0, 5))
    gaps = draw(st.lists(st.integers(0, 400_000), min_size=num, max_size=num))
    return RequestRecord(
        request_id=f"r{index}-{draw(st.text(max_size=8))}",
        vantage=draw(st.sampled_from(Vantage)),
        arrival_time_ns=now_ns - draw(st.integers(0, 7_200 * 10**9)),
        labels=Labels(
            model=draw(st.sampled_from(["llama", "qwen", ""])),
            tenant=draw(st.sampled_from(["", "acme"])),
        ),
        emission_offsets_us=np.cumsum(np.array(gaps, dtype=np.int64)),
        token_detail=draw(st.sampled_from(TokenDetail)),
        status=draw(st.sampled_from(Status)),
        final=draw(st.booleans()),
    )


@st.composite
def wire_batches(draw: st.DrawFn) -> bytes:
    """A valid binary record batch from a few exporters, with sequence numbers that may
    repeat (duplicates) or fall behind the de-duplication window (409)."""
    now_ns = time.time_ns()
    size = draw(st.integers(0, 4))
    batch = RecordBatch.from_records([draw(_records(k, now_ns)) for k in range(size)])
    exporter_id = draw(st.sampled_from(["gw-0", "gw-1", "worker-0"]))
    return encode_batch(batch, exporter_id=exporter_id, seq=draw(st.integers(0, 3000)))


_ATTRIBUTES = (
    "gen_ai.request.id",
    "gen_ai.request.model",
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.e2e",
    "gen_ai.latency.time_in_queue",
    "goodput.status",
    "goodput.vantage",
    "goodput.tenant",
)
_VALUES = st.one_of(
    st.integers(-10, 5_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["ok", "error", "engine", "gateway", "acme", "llama"]),
    st.text(max_size=8),
    st.booleans(),
)


def _set_value(attribute: KeyValue, value: object) -> None:
    if isinstance(value, bool):
        attribute.value.bool_value = value
    elif isinstance(value, int):
        attribute.value.int_value = value
    elif isinstance(value, float):
        attribute.value.double_value = value
    else:
        attribute.value.string_value = str(value)


@st.composite
def otlp_requests(draw: st.DrawFn) -> bytes:
    """A valid ``ExportTraceServiceRequest``: ``llm_request`` and other spans whose
    attributes and token events may be missing, out of range or of the wrong type (the
    receiver rejects such spans one by one, in ``partial_success``)."""
    request = ExportTraceServiceRequest()
    now_ns = time.time_ns()
    for _ in range(draw(st.integers(0, 3))):
        span = request.resource_spans.add().scope_spans.add().spans.add()
        span.name = draw(st.sampled_from(["llm_request", "llm_request", "http.request"]))
        span.trace_id = draw(st.binary(min_size=16, max_size=16))
        span.span_id = draw(st.binary(min_size=8, max_size=8))
        span.start_time_unix_nano = now_ns - draw(st.integers(0, 600 * 10**9))
        span.end_time_unix_nano = span.start_time_unix_nano + draw(st.integers(0, 30 * 10**9))
        attributes = draw(st.dictionaries(st.sampled_from(_ATTRIBUTES), _VALUES, max_size=8))
        for key, value in attributes.items():
            attribute = span.attributes.add()
            attribute.key = key
            _set_value(attribute, value)
        for offset_ns in draw(st.lists(st.integers(-(10**9), 30 * 10**9), max_size=4)):
            event = span.events.add()
            event.name = "token"
            event.time_unix_nano = max(0, span.start_time_unix_nano + offset_ns)
    return request.SerializeToString()


schemathesis.openapi.media_type(CONTENT_TYPE_BINARY, wire_batches())
schemathesis.openapi.media_type(CONTENT_TYPE_PROTOBUF, otlp_requests())


# The admin key Schemathesis sends, known before collection (where it already builds the
# explicit examples' cases); the admin_key fixture stores its hash, as create_key would.
ADMIN_KEY = key_service.generate_key()


@pytest.fixture(scope="module")
def admin_key(postgresql_url: str) -> Iterator[str]:
    engine = sa.create_engine(sync_url(postgresql_url))
    with Session(engine) as session, session.begin():
        session.add(
            APIKey(
                name="schemathesis",
                prefix=ADMIN_KEY[: key_service.PREFIX_LENGTH],
                hash=key_service.hash_key(ADMIN_KEY),
                role=KeyRole.ADMIN,
            )
        )
    yield ADMIN_KEY
    shutdown_lifespans()
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


@pytest.fixture(scope="module")
def app(postgresql_url: str) -> FastAPI:
    # PostgreSQL: the stricter backend (it refuses NUL characters, overlong values, ...).
    # The fuzzer sends thousands of invalid keys from one address and expects each to be a
    # 401: the failed-authentication rate limit (test_hardening.py) would answer 429.
    return create_app(
        Settings(database_url=postgresql_url, auth_failure_burst=10**9, admin_burst=10**9)
    )


# The schema comes from create_app's OpenAPI document, without starting an app (its lifespan
# needs a migrated database); every case is sent to the PostgreSQL-backed app fixture above.
# (schemathesis.pytest.from_fixture would be the lazy alternative; it breaks on pytest 9.)
_schema_app = create_app(Settings(database_url="sqlite:///:memory:"))
schema = schemathesis.openapi.from_dict(_schema_app.openapi())
schema.app = _schema_app  # marks the schema as ASGI; calls pass the real app
schema.location = "/openapi.json"


@schema.auth(refresh_interval=None, retry_on=[])
class AdminKey:
    """The admin key, through Schemathesis' own auth hook rather than a header forced onto
    every case: a case generated without a valid ``Authorization`` (to test that it is
    refused) is then sent without one."""

    def get(self, case: schemathesis.Case[Any], context: schemathesis.AuthContext) -> str:
        return ADMIN_KEY

    def set(
        self, case: schemathesis.Case[Any], data: str, context: schemathesis.AuthContext
    ) -> None:
        case.headers["Authorization"] = f"Bearer {data}"


@schema.exclude(path_regex=STREAMS).parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(
    case: schemathesis.Case[Any], app: FastAPI, admin_key: str
) -> None:
    json_batch = case.path == INGEST and case.media_type == CONTENT_TYPE_JSON
    case.call_and_validate(
        app=app, excluded_checks=[positive_data_acceptance] if json_batch else None
    )


def test_every_route_but_the_streams_is_fuzzed() -> None:
    documented = {
        (method.upper(), path)
        for path, operations in _schema_app.openapi()["paths"].items()
        for method in operations
    }
    fuzzed: set[tuple[str, str]] = set()
    for result in schema.exclude(path_regex=STREAMS).get_all_operations():
        assert isinstance(result, Ok), result
        fuzzed.add((result.ok().method.upper(), result.ok().path))
    assert documented - fuzzed == {("GET", STREAM), ("GET", SUMMARY_STREAM)}
