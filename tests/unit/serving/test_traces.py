"""Trace readers: parsing (in memory), scaling, slicing, and the shared trace files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from serving.traces import (
    TRACE_NAMES,
    Trace,
    TraceError,
    load_azure,
    load_mooncake,
    load_trace,
    parse_azure_csv,
    parse_mooncake_jsonl,
    shared_dir,
)

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:50.9951690,879,55
2023-11-16 18:16:46.0000000,10,1
"""


def mooncake_text(*rows: dict[str, object]) -> str:
    return "\n".join(json.dumps(row) for row in rows) + "\n"


def test_azure_csv_becomes_seconds_after_the_first_request() -> None:
    trace = parse_azure_csv(AZURE, "conv")
    assert trace.name == "conv"
    np.testing.assert_allclose(trace.arrival_s, [0.0, 4.314579, 4.314579, 59.31941])
    assert trace.arrival_s.dtype == np.float64
    assert trace.input_tokens.tolist() == [374, 396, 879, 10]
    assert trace.output_tokens.tolist() == [44, 109, 55, 1]
    assert trace.input_tokens.dtype == trace.output_tokens.dtype == np.int64
    assert trace.hash_ids is None
    assert len(trace) == 4
    assert trace.duration_s == pytest.approx(59.31941)


def test_a_byte_order_mark_and_blank_lines_are_tolerated() -> None:
    trace = parse_azure_csv("\ufeff" + AZURE.replace("\n2023-11-16 18:16", "\n\n2023-11-16 18:16"))
    assert len(trace) == 4


def test_mooncake_jsonl_keeps_hash_ids_and_converts_milliseconds() -> None:
    trace = parse_mooncake_jsonl(
        mooncake_text(
            {"timestamp": 1000, "input_length": 1024, "output_length": 6, "hash_ids": [0, 1]},
            {"timestamp": 1040, "input_length": 513, "output_length": 4, "hash_ids": [0, 2]},
            {"timestamp": 2500, "input_length": 12, "output_length": 1},
        )
    )
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.04, 1.5])
    assert trace.input_tokens.tolist() == [1024, 513, 12]
    assert trace.output_tokens.tolist() == [6, 4, 1]
    assert trace.hash_ids == [[0, 1], [0, 2], []]


def test_unsorted_rows_are_sorted_stably_with_their_hash_ids() -> None:
    trace = parse_mooncake_jsonl(
        mooncake_text(
            {"timestamp": 50, "input_length": 1, "output_length": 1, "hash_ids": [5]},
            {"timestamp": 10, "input_length": 2, "output_length": 1, "hash_ids": [1]},
            {"timestamp": 50, "input_length": 3, "output_length": 1, "hash_ids": [7]},
        )
    )
    assert trace.input_tokens.tolist() == [2, 1, 3]
    assert trace.hash_ids == [[1], [5], [7]]
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.04, 0.04])


def test_empty_traces_are_empty() -> None:
    for trace in (parse_azure_csv(AZURE.splitlines()[0]), parse_mooncake_jsonl("")):
        assert len(trace) == 0
        assert trace.duration_s == 0.0
        assert len(trace.slice(0, 10)) == 0


def test_scaled_divides_inter_arrival_times() -> None:
    trace = parse_azure_csv(AZURE)
    faster = trace.scaled(2.0)
    np.testing.assert_allclose(faster.arrival_s, trace.arrival_s / 2)
    assert faster.input_tokens is trace.input_tokens
    np.testing.assert_allclose(trace.scaled(0.5).arrival_s, trace.arrival_s * 2)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(TraceError, match=r"^rate_scale: must be a finite number > 0, got "):
            trace.scaled(bad)


def test_slice_keeps_the_window_and_rebases_to_its_start() -> None:
    trace = parse_mooncake_jsonl(
        mooncake_text(
            *(
                {"timestamp": t, "input_length": t, "output_length": 1, "hash_ids": [t]}
                for t in (0, 1000, 2000, 3000, 4000)
            )
        )
    )
    window = trace.slice(1.0, 2.0)  # [1 s, 3 s): the 3 s arrival is excluded
    np.testing.assert_allclose(window.arrival_s, [0.0, 1.0])
    assert window.input_tokens.tolist() == [1000, 2000]
    assert window.hash_ids == [[1000], [2000]]
    np.testing.assert_allclose(trace.slice(0.5, 1.0).arrival_s, [0.5])
    assert len(trace.slice(10.0, 5.0)) == 0
    with pytest.raises(TraceError, match=r"^start_s: must be a finite number >= 0, got -1.0$"):
        trace.slice(-1.0, 1.0)
    with pytest.raises(TraceError, match=r"^duration_s: must be a finite number > 0, got 0$"):
        trace.slice(0.0, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "time,in,out\n",
            "t.csv:1: expected the header 'TIMESTAMP,ContextTokens,GeneratedTokens', "
            "got 'time,in,out'",
        ),
        (
            AZURE + "2023-11-16 18:17:00.0,5\n",
            "t.csv:6: expected 3 comma-separated fields, got ['2023-11-16 18:17:00.0', '5']",
        ),
        (
            AZURE + "yesterday,5,6\n",
            "t.csv:6: TIMESTAMP: expected 'YYYY-MM-DD hh:mm:ss.fffffff', got 'yesterday'",
        ),
        (
            AZURE + "2023-11-16 18:17:00.0,5,many\n",
            "t.csv:6: GeneratedTokens: expected an integer >= 0, got 'many'",
        ),
        (
            AZURE + "2023-11-16 18:17:00.0,-5,6\n",
            "t.csv:6: ContextTokens: expected an integer >= 0, got '-5'",
        ),
    ],
)
def test_bad_azure_rows_name_the_line_and_field(text: str, message: str) -> None:
    with pytest.raises(TraceError) as exc:
        parse_azure_csv(text, "t.csv")
    assert str(exc.value) == message


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "{oops",
            "m.jsonl:2: invalid JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1))",
        ),
        ("[1, 2]", "m.jsonl:2: expected an object, got list"),
        (
            '{"timestamp": 5, "input_length": 1}',
            "m.jsonl:2: output_length: expected an integer >= 0, got None",
        ),
        (
            '{"timestamp": 5.5, "input_length": 1, "output_length": 1}',
            "m.jsonl:2: timestamp: expected an integer >= 0, got 5.5",
        ),
        (
            '{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}',
            "m.jsonl:2: hash_ids: expected a list of integers",
        ),
    ],
)
def test_bad_mooncake_rows_name_the_line_and_field(line: str, message: str) -> None:
    good = mooncake_text({"timestamp": 0, "input_length": 1, "output_length": 1})
    with pytest.raises(TraceError) as exc:
        parse_mooncake_jsonl(good + line + "\n", "m.jsonl")
    assert str(exc.value) == message


def test_trace_checks_its_columns() -> None:
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(TraceError, match=r"^input_tokens: expected 2 values, got shape \(1,\)$"):
        Trace(np.zeros(2), one, one)
    with pytest.raises(TraceError, match=r"^arrival_s: must be >= 0 and non-decreasing$"):
        Trace(np.array([1.0, 0.5]), np.zeros(2, np.int64), np.zeros(2, np.int64))
    with pytest.raises(TraceError, match=r"^hash_ids: expected 1 lists, got 0$"):
        Trace(np.zeros(1), one, one, [])


def test_shared_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODPUT_SHARED_DIR", "/somewhere/shared")
    assert shared_dir() == Path("/somewhere/shared")
    monkeypatch.delenv("GOODPUT_SHARED_DIR")
    assert shared_dir() == Path(__file__).resolve().parents[3].parent / "shared"


def test_unknown_trace_names_list_the_known_ones() -> None:
    with pytest.raises(TraceError) as exc:
        load_trace("sharegpt")
    assert str(exc.value) == (
        "unknown trace 'sharegpt': expected one of ['azure_code', 'azure_conv', 'mooncake'] "
        "or a path ending in .csv (Azure) or .jsonl (Mooncake)"
    )


# Reading the real files in the shared folder is file I/O: the integration tier runs it.


@pytest.mark.integration
@pytest.mark.parametrize(
    ("name", "rows"), [("azure_code", 8_819), ("azure_conv", 19_366), ("mooncake", 3_993)]
)
def test_shared_traces_load_whole(name: str, rows: int) -> None:
    trace = load_trace(name)  # row counts from the traces' SOURCE.txt
    assert (trace.name, len(trace)) == (name, rows)
    assert trace.arrival_s[0] == 0.0
    assert (np.diff(trace.arrival_s) >= 0).all()
    assert int(trace.output_tokens.min()) >= 1
    assert (trace.hash_ids is not None) == (name == "mooncake")


@pytest.mark.integration
def test_loaders_accept_kinds_and_paths(tmp_path: Path) -> None:
    conv = load_azure("conv")
    assert conv.duration_s == pytest.approx(3501.721937)
    assert conv.input_tokens[:3].tolist() == [374, 396, 879]
    copy = tmp_path / "mini.csv"
    copy.write_text(AZURE)
    assert load_trace(copy).name == "mini"
    assert load_trace(str(copy)).output_tokens.tolist() == [44, 109, 55, 1]
    lines = tmp_path / "mini.jsonl"
    lines.write_text(mooncake_text({"timestamp": 3, "input_length": 2, "output_length": 1}))
    assert load_mooncake(lines).input_tokens.tolist() == [2]
    assert load_mooncake().hash_ids is not None
    with pytest.raises(TraceError, match=r"no such trace file$"):
        load_trace(tmp_path / "missing.csv")
    assert set(TRACE_NAMES) == {"azure_code", "azure_conv", "mooncake"}
