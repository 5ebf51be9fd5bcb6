"""The JSON Schema published for ``POST /api/v1/ingest``'s JSON form describes what the wire
codec reads: a batch it encodes validates, and a body the schema refuses the codec refuses."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from controlplane.schemas.ingest import WIRE_BATCH_JSON_SCHEMA
from exporters.records import Labels, RecordBatch, RequestRecord, Status, Vantage
from exporters.wire import WireError, batch_from_json, batch_to_json

VALIDATOR = Draft202012Validator(WIRE_BATCH_JSON_SCHEMA)


def sample(emission_tokens: list[int] | None = None) -> dict[str, Any]:
    record = RequestRecord(
        request_id="r0",
        vantage=Vantage.ENGINE,
        arrival_time_ns=1_700_000_000_000_000_000,
        labels=Labels(model="llama", tenant="acme"),
        emission_offsets_us=np.array([120_000, 150_000], dtype=np.int64),
        emission_tokens=None if emission_tokens is None else np.array(emission_tokens, np.int32),
        status=Status.ERROR,
        reason="oom",
    )
    return batch_to_json(RecordBatch.from_records([record]), exporter_id="gw-0", seq=3)


def test_the_schema_is_valid_json_schema() -> None:
    Draft202012Validator.check_schema(WIRE_BATCH_JSON_SCHEMA)


@pytest.mark.parametrize("tokens", [None, [1, 40]])
def test_an_encoded_batch_validates_and_holds_every_field(tokens: list[int] | None) -> None:
    document = sample(tokens)
    VALIDATOR.validate(document)
    assert set(WIRE_BATCH_JSON_SCHEMA["required"]) == set(document)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("v",), 2),
        (("exporter_id",), ""),
        (("seq",), -1),
        (("status",), ["great"]),
        (("prompt_tokens",), [2**31]),
        (("final",), [1]),
        (("labels", "color"), ["red"]),
        (("phase_offsets_us", "queued"), [-2]),
        (("emission_offsets_us",), [[-1]]),
        (("emission_tokens",), [[0, 1]]),
        (("extra",), 1),
    ],
)
def test_what_the_schema_refuses_the_codec_refuses(path: tuple[str, ...], value: object) -> None:
    document = copy.deepcopy(sample())
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert not VALIDATOR.is_valid(document)
    with pytest.raises(WireError):
        batch_from_json(document)
