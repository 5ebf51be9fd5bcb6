"""OpenSLO v1 mapping, both ways, without a database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import yaml

from controlplane.errors import InvalidInputError
from controlplane.openslo import export_yaml, format_duration, parse_documents, parse_duration
from controlplane.schemas.slo import SLOCreate, SLOPublic

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def public(**overrides: object) -> SLOPublic:
    fields: dict[str, object] = {
        "id": uuid.uuid4(),
        "name": "chat",
        "description": "chat",
        "selector": {"model": "llama"},
        "objectives": [
            {"metric": "ttft", "threshold_s": 0.2, "statistic": "max"},
            {"metric": "itl", "threshold_s": 0.05, "statistic": "p99"},
        ],
        "target": 0.99,
        "window_s": 3_600,
        "vantage": "gateway",
        "availability_target": None,
        "version": 3,
        "created_at": NOW,
        "updated_at": NOW,
        "deleted_at": None,
    }
    fields.update(overrides)
    return SLOPublic.model_validate(fields)


@pytest.mark.parametrize(
    ("seconds", "text"), [(2_419_200, "28d"), (86_400, "1d"), (5_400, "90m"), (61, "61s")]
)
def test_durations(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text, "w") == seconds


def test_week_unit_is_read() -> None:
    assert parse_duration("2w", "w") == 1_209_600


@pytest.mark.parametrize("availability", [None, 0.999])
def test_export_is_reimported_as_the_same_definition(availability: float | None) -> None:
    slo = public(availability_target=availability, vantage="engine")
    (parsed,) = parse_documents(export_yaml([slo]))
    expected = SLOCreate.model_validate(
        slo.model_dump(
            include={
                "name",
                "description",
                "selector",
                "objectives",
                "target",
                "window_s",
                "vantage",
                "availability_target",
            }
        )
    )
    assert parsed == expected


def test_export_document_shape() -> None:
    doc = yaml.safe_load(export_yaml([public()]))
    assert doc["apiVersion"] == "openslo/v1"
    assert doc["kind"] == "SLO"
    assert doc["spec"]["service"] == "llama"
    assert doc["spec"]["budgetingMethod"] == "Occurrences"
    ratio = doc["spec"]["indicator"]["spec"]["ratioMetric"]
    assert ratio["counter"] is True
    assert ratio["good"]["metricSource"]["spec"]["objectives"][1] == {
        "metric": "itl",
        "op": "lte",
        "threshold_s": 0.05,
        "statistic": "p99",
    }
    assert ratio["total"]["metricSource"]["spec"] == {
        "requests": "total",
        "selector": {"model": "llama"},
    }
    assert "&" not in export_yaml([public()])  # no YAML anchors: imports refuse aliases


def test_several_documents_in_one_stream() -> None:
    stream = export_yaml([public(name="a"), public(name="b")])
    assert [d.name for d in parse_documents(stream)] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "body has no YAML documents; expected one or more SLOs"),
        ("- 1\n- 2\n", "documents[0] must be a mapping (an SLO), got list"),
        (
            "apiVersion: openslo/v2alpha\n",
            "documents[0].apiVersion must be one of ['openslo/v1'], got 'openslo/v2alpha'",
        ),
        (
            "apiVersion: openslo/v1\nkind: Service\n",
            "documents[0].kind must be one of ['SLO'], got 'Service'",
        ),
        (
            "apiVersion: openslo/v1\nkind: SLO\nmetadata: {name: x}\nspec: {indicatorRef: x}\n",
            "documents[0].spec.indicatorRef is not supported: inline the SLI as spec.indicator",
        ),
        ("name: x\nobjectives: []\ntarget: 2\n", "documents[0].target must be in (0, 1), got 2"),
    ],
)
def test_errors_name_document_and_field(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_documents(text)
    assert caught.value.message == message
