"""The up wire contract: binary and JSON round trips, and every way a batch is refused."""

from __future__ import annotations

import contextlib
import json
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from exporters.records import (
    LABEL_KEYS,
    Labels,
    RecordBatch,
    RequestRecord,
    Status,
    TokenDetail,
    Vantage,
)
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

U32_MAX = 2**32 - 1
labels_text = st.text(max_size=12)  # any unicode, including "" and astral characters


@st.composite
def records(draw: st.DrawFn, index: int) -> RequestRecord:
    num = draw(st.integers(0, 6))
    # Mostly ITL-sized gaps; sometimes one wider than uint32 µs (71.6 minutes).
    gaps = st.integers(0, 60_000) | st.integers(U32_MAX - 2, 2**40)
    steps = draw(st.lists(gaps, min_size=num, max_size=num))
    offsets = np.cumsum(np.array(steps, dtype=np.int64))
    detail = draw(st.sampled_from(TokenDetail))
    chunks = draw(st.none() | st.lists(st.integers(1, 64), min_size=num, max_size=num))
    return RequestRecord(
        request_id=draw(st.text(max_size=20)) + f"#{index}",
        vantage=draw(st.sampled_from(Vantage)),
        arrival_time_ns=draw(st.integers(-(2**63), 2**63 - 1)),
        labels=Labels(*draw(st.lists(labels_text, min_size=5, max_size=5))),
        emission_offsets_us=offsets,
        emission_tokens=None if chunks is None else np.array(chunks, dtype=np.int32),
        token_detail=detail,
        phase_offsets_us=np.array(
            draw(st.lists(st.integers(-1, 2**62), min_size=6, max_size=6)), dtype=np.int64
        ),
        kv_bytes=draw(st.integers(0, 2**62)),
        prompt_tokens=draw(st.integers(0, 2**31 - 1)),
        cached_tokens=draw(st.integers(0, 2**31 - 1)),
        status=draw(st.sampled_from(Status)),
        reason=draw(labels_text),
        final=draw(st.booleans()),
    )


@st.composite
def batches(draw: st.DrawFn, max_size: int = 8) -> RecordBatch:
    size = draw(st.integers(0, max_size))
    return RecordBatch.from_records([draw(records(i)) for i in range(size)])


headers = st.builds(
    BatchHeader,
    exporter_id=st.text(min_size=1, max_size=40),
    seq=st.integers(0, 2**63 - 1),
    sent_time_ns=st.integers(0, 2**63 - 1),
)


def sample_batch() -> RecordBatch:
    return RecordBatch.from_records(
        [
            RequestRecord(
                request_id="r0",
                vantage=Vantage.GATEWAY,
                arrival_time_ns=1_700_000_000_000_000_000,
                labels=Labels(model="llama", tenant="acme", priority="high"),
                emission_offsets_us=np.array([120_000, 150_000, 185_000], dtype=np.int64),
                prompt_tokens=512,
            ),
            RequestRecord(
                request_id="r1",
                vantage=Vantage.ENGINE,
                arrival_time_ns=1_700_000_000_100_000_000,
                labels=Labels(model="llama", slo="chat"),
                emission_offsets_us=np.array([90_000, 400_000], dtype=np.int64),
                emission_tokens=np.array([1, 40], dtype=np.int32),
                token_detail=TokenDetail.SUMMARY,
            ),
            RequestRecord(
                request_id="r2",
                vantage=Vantage.GATEWAY,
                arrival_time_ns=1_700_000_000_200_000_000,
                status=Status.REJECTED,
                reason="shed",
            ),
        ]
    )


def encode(batch: RecordBatch | None = None, seq: int = 7) -> bytes:
    return encode_batch(
        sample_batch() if batch is None else batch, exporter_id="gw-0", seq=seq, sent_time_ns=99
    )


def reframe(data: bytes, mutate: Callable[[dict[str, Any]], None]) -> bytes:
    """Change the body of an encoded batch and re-seal it with a valid checksum, so the
    decoder's content checks (not the CRC) are what is exercised."""
    envelope = msgpack.unpackb(data)
    body = msgpack.unpackb(envelope["body"])
    mutate(body)
    envelope["body"] = msgpack.packb(body)
    envelope["crc32"] = zlib.crc32(envelope["body"])
    return msgpack.packb(envelope)


def body_of(data: bytes) -> dict[str, Any]:
    body: dict[str, Any] = msgpack.unpackb(msgpack.unpackb(data)["body"])
    return body


def assert_same_batch(got: RecordBatch, want: RecordBatch, *, same_dictionaries: bool) -> None:
    assert got.request_ids == want.request_ids
    for name in (
        "vantage",
        "arrival_time_ns",
        "status",
        "final",
        "token_detail",
        "phase_offsets_us",
        "kv_bytes",
        "prompt_tokens",
        "cached_tokens",
        "emission_starts",
        "emission_offsets_us",
        "emission_tokens",
    ):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        assert getattr(got, name).dtype == getattr(want, name).dtype, name
    for key in LABEL_KEYS:
        assert got.labels[key].decode() == want.labels[key].decode()
    assert got.reason.decode() == want.reason.decode()
    if same_dictionaries:
        for key in LABEL_KEYS:
            assert got.labels[key].values == want.labels[key].values
            np.testing.assert_array_equal(got.labels[key].codes, want.labels[key].codes)


# --- round trips -------------------------------------------------------------------------


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), headers)
def test_binary_round_trip_is_exact(batch: RecordBatch, header: BatchHeader) -> None:
    data = encode_batch(
        batch, exporter_id=header.exporter_id, seq=header.seq, sent_time_ns=header.sent_time_ns
    )
    got_header, got = decode_batch(data)
    assert got_header == header
    assert_same_batch(got, batch, same_dictionaries=True)


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), headers)
def test_json_round_trip_through_text_is_exact(batch: RecordBatch, header: BatchHeader) -> None:
    obj = batch_to_json(
        batch, exporter_id=header.exporter_id, seq=header.seq, sent_time_ns=header.sent_time_ns
    )
    got_header, got = batch_from_json(json.loads(json.dumps(obj)))
    assert got_header == header
    assert_same_batch(got, batch, same_dictionaries=False)


def test_empty_batch_round_trips_in_both_forms() -> None:
    empty = RecordBatch.empty()
    header, got = decode_batch(encode(empty, seq=0))
    assert (header.exporter_id, header.seq, header.sent_time_ns) == ("gw-0", 0, 99)
    assert_same_batch(got, empty, same_dictionaries=True)
    _, got = batch_from_json(batch_to_json(empty, exporter_id="gw-0", seq=0))
    assert_same_batch(got, empty, same_dictionaries=True)


def test_decoded_arrays_are_owned_and_writable() -> None:
    _, got = decode_batch(encode())
    for array in (got.arrival_time_ns, got.emission_offsets_us, got.emission_tokens, got.final):
        assert array.flags.writeable
        array[:1] = array[:1]  # no "assignment destination is read-only"


def test_an_envelope_in_another_key_order_decodes_the_same() -> None:
    """The exporters' envelope layout is read in place; any other valid msgpack layout of
    the same envelope (keys reordered, a wider integer for the version) decodes the same."""
    data = encode()
    envelope = msgpack.unpackb(data)
    reordered = b"\x83" + b"".join(
        msgpack.packb(key) + value
        for key, value in (
            ("body", msgpack.packb(envelope["body"], use_bin_type=True)),
            ("crc32", msgpack.packb(envelope["crc32"])),
            ("v", b"\xcd\x00\x01"),
        )
    )
    assert reordered != data
    header, got = decode_batch(reordered)
    same_header, want = decode_batch(data)
    assert header == same_header
    assert_same_batch(got, want, same_dictionaries=True)


def test_sent_time_defaults_to_the_wall_clock() -> None:
    header, _ = decode_batch(encode_batch(sample_batch(), exporter_id="gw-0", seq=1))
    assert header.sent_time_ns > 1_600_000_000 * 10**9
    assert header.version == WIRE_VERSION


def test_one_token_per_emission_costs_four_bytes_per_token() -> None:
    def per_token(num_tokens: int) -> RecordBatch:
        offsets = np.arange(num_tokens, dtype=np.int64) * 5_000
        return RecordBatch.from_records(
            [RequestRecord("a", Vantage.GATEWAY, 0, emission_offsets_us=offsets)]
        )

    data = encode(per_token(1000))
    assert body_of(data)["emission_tokens"] is None  # not 4 more bytes of 1s per token
    assert len(encode(per_token(2000))) - len(data) == 1000 * 4  # uint32 deltas
    np.testing.assert_array_equal(decode_batch(data)[1].emission_tokens, np.ones(1000))
    assert body_of(encode())["emission_tokens"] == np.array([1, 1, 1, 1, 40], "<i4").tobytes()


def test_token_gaps_wider_than_uint32_switch_the_batch_to_int64_deltas() -> None:
    def batch(first_offset: int) -> RecordBatch:
        offsets = np.array([first_offset, first_offset + 7], dtype=np.int64)
        return RecordBatch.from_records(
            [RequestRecord("a", Vantage.ENGINE, 0, emission_offsets_us=offsets)]
        )

    assert body_of(encode(batch(U32_MAX)))["emission_deltas_type"] == "u32"
    wide = encode(batch(U32_MAX + 1))
    assert body_of(wide)["emission_deltas_type"] == "i64"
    assert decode_batch(wide)[1].emission_offsets_us.tolist() == [U32_MAX + 1, U32_MAX + 8]


def test_decode_any_chooses_the_codec_by_content_type() -> None:
    want = sample_batch()
    text = json.dumps(batch_to_json(want, exporter_id="gw-0", seq=3)).encode()
    for data, content_type in (
        (encode(want), CONTENT_TYPE_BINARY),
        (text, CONTENT_TYPE_JSON),
        (text, "Application/JSON; charset=utf-8"),
    ):
        _, got = decode_any(data, content_type)
        assert_same_batch(got, want, same_dictionaries=False)
    with pytest.raises(WireError) as exc:
        decode_any(text, "text/plain")
    assert str(exc.value) == (
        "content_type: unsupported 'text/plain'; supported: "
        "['application/vnd.goodput.batch+msgpack', 'application/json']"
    )
    assert (exc.value.field, exc.value.reason) == ("content_type", str(exc.value)[14:])
    _, got = decode_any(memoryview(text), CONTENT_TYPE_JSON)  # any bytes-like body
    assert_same_batch(got, want, same_dictionaries=False)
    _, got = decode_any(memoryview(encode(want)), CONTENT_TYPE_BINARY)
    assert_same_batch(got, want, same_dictionaries=True)
    with pytest.raises(WireError) as exc:
        decode_any(text.decode(), CONTENT_TYPE_JSON)  # type: ignore[arg-type]
    assert str(exc.value) == "batch: expected bytes, got str"


def test_json_form_is_human_readable() -> None:
    obj = batch_to_json(sample_batch(), exporter_id="gw-0", seq=3, sent_time_ns=5)
    assert obj["v"] == 1
    assert obj["vantage"] == ["gateway", "engine", "gateway"]
    assert obj["status"] == ["ok", "ok", "rejected"]
    assert obj["token_detail"] == ["full", "summary", "full"]
    assert obj["labels"]["model"] == ["llama", "llama", ""]
    assert obj["phase_offsets_us"]["prefill_start"] == [-1, -1, -1]
    assert obj["emission_offsets_us"] == [[120_000, 150_000, 185_000], [90_000, 400_000], []]
    assert obj["emission_tokens"] == [[1, 1, 1], [1, 40], []]


# --- framing: size, truncation, corruption, version --------------------------------------


def decode_error(data: bytes, **kwargs: Any) -> str:
    with pytest.raises(WireError) as exc:
        decode_batch(data, **kwargs)
    return str(exc.value)


def test_every_truncation_is_reported_as_truncated() -> None:
    data = encode()
    for end in range(len(data)):
        assert decode_error(data[:end]) == "batch: truncated (the message ends early)"


def test_trailing_garbage_is_refused() -> None:
    assert decode_error(encode() + b"\x00\x01") == (
        "batch: unexpected trailing data after the message (2 bytes)"
    )


def test_a_flipped_body_byte_fails_the_checksum() -> None:
    data = bytearray(encode())
    body = msgpack.unpackb(bytes(data))["body"]
    position = bytes(data).index(body) + len(body) // 2
    data[position] ^= 0x40
    corrupted = msgpack.unpackb(bytes(data))["body"]
    assert decode_error(bytes(data)) == (
        f"crc32: checksum mismatch (message says {zlib.crc32(body)}, "
        f"body has {zlib.crc32(corrupted)}): corrupted"
    )


@settings(deadline=None, max_examples=300)
@given(st.data())
def test_any_flipped_byte_is_refused(data: st.DataObject) -> None:
    encoded = bytearray(encode())
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    # 0xce (uint32) -> 0xd2 (int32) re-types the CRC without changing its value.
    with contextlib.suppress(ValueError, msgpack.ExtraData, msgpack.FormatError):
        assume(msgpack.unpackb(bytes(encoded)) != msgpack.unpackb(encode()))
    with pytest.raises(WireError):
        decode_batch(bytes(encoded))


@settings(deadline=None, max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_wire_errors(garbage: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(garbage)


def test_oversized_batch_is_refused_before_parsing() -> None:
    data = encode()
    assert decode_error(data, max_bytes=len(data) - 1) == (
        f"batch: {len(data)} bytes exceed max_bytes {len(data) - 1}"
    )
    assert decode_batch(data, max_bytes=len(data))[0].seq == 7
    text = json.dumps(batch_to_json(sample_batch(), exporter_id="gw-0", seq=3)).encode()
    with pytest.raises(WireError, match=rf"^batch: {len(text)} bytes exceed max_bytes 10$"):
        decode_any(text, CONTENT_TYPE_JSON, max_bytes=10)


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (2, "v: unsupported wire version 2; supported versions: [1]"),
        (0, "v: unsupported wire version 0; supported versions: [1]"),
        ("1", "v: unsupported wire version '1'; supported versions: [1]"),
    ],
)
def test_unknown_versions_are_refused_with_the_supported_ones(version: Any, message: str) -> None:
    envelope = msgpack.unpackb(encode())
    envelope["v"] = version
    assert decode_error(msgpack.packb(envelope)) == message
    obj = batch_to_json(sample_batch(), exporter_id="gw-0", seq=3)
    obj["v"] = version
    with pytest.raises(WireError) as exc:
        batch_from_json(obj)
    assert str(exc.value) == message


def test_a_newer_writer_with_a_different_layout_still_gets_a_version_error() -> None:
    assert decode_error(msgpack.packb({"v": 2, "frames": [b"..."]})) == (
        "v: unsupported wire version 2; supported versions: [1]"
    )
    assert decode_error(msgpack.packb({"body": b""})) == "v: missing"
    assert decode_error(msgpack.packb([1, 2])) == "batch: expected a map, got list"


# --- content: lengths, codes, counts, deltas ----------------------------------------------


def content_error(mutate: Callable[[dict[str, Any]], None]) -> str:
    return decode_error(reframe(encode(), mutate))


def set_field(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda body: body.__setitem__(name, value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            set_field("arrival_time_ns", np.zeros(2, "<i8").tobytes()),
            "arrival_time_ns: expected 3 x int64 (24 bytes), got 16 bytes",
        ),
        (set_field("request_ids", ["r0", "r1"]), "request_ids: expected 3 strings, got 2"),
        (
            set_field("request_ids", ["r0", "r1", 2]),
            "request_ids: expected an array of strings, found another type",
        ),
        (set_field("final", b"\x01\x02\x00"), "final: values must be 0 or 1, got 2"),
        (
            set_field("phase_offsets_us", b""),
            "phase_offsets_us: expected 18 x int64 (144 bytes), got 0 bytes",
        ),
        (set_field("num_records", -1), "num_records: must be an integer in [0, 100000], got -1"),
        (
            set_field("num_emissions", 2**24 + 1),
            f"num_emissions: must be an integer in [0, {2**24}], got {2**24 + 1}",
        ),
        (set_field("seq", -1), "seq: must be an integer in [0, 2**63 - 1], got -1"),
        (
            set_field("exporter_id", ""),
            "exporter_id: must be a non-empty string of at most 256 characters, got ''",
        ),
        (
            set_field("emission_counts", np.array([3, 2, 1], "<u4").tobytes()),
            "emission_counts: sum to 6, num_emissions is 5",
        ),
        (
            set_field("emission_tokens", np.array([1, 1, 1, 0, 40], "<i4").tobytes()),
            "emission_tokens: every emission carries >= 1 token",
        ),
        (
            set_field("vantage", b"\x00\x07\x00"),
            "status/vantage: allowed values are ['IN_FLIGHT', 'OK', 'ERROR', 'ABORTED', "
            "'REJECTED'] / ['GATEWAY', 'ENGINE']",
        ),
        (
            set_field("kv_bytes", np.array([0, -5, 0], "<i8").tobytes()),
            "kv_bytes: must be >= 0, got -5",
        ),
        (
            set_field("emission_deltas_type", "u16"),
            "emission_deltas_type: unknown type 'u16'; allowed: ['u32', 'i64']",
        ),
        (
            set_field("emission_deltas_type", ["u32"]),
            "emission_deltas_type: unknown type ['u32']; allowed: ['u32', 'i64']",
        ),
        (lambda body: body.pop("reason"), "reason: missing"),
        (
            set_field("colour", "red"),
            "body: unknown fields ['colour']; allowed: " + str(list(body_of(encode()))),
        ),
        (set_field("labels", []), "labels: expected a map, got list"),
    ],
)
def test_inconsistent_content_is_refused(
    mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    assert content_error(mutate) == message


def test_out_of_range_dictionary_codes_are_refused() -> None:
    def bad_model_code(body: dict[str, Any]) -> None:
        body["labels"]["model"]["codes"] = np.array([0, 0, 2], "<u4").tobytes()

    assert body_of(encode())["labels"]["model"]["values"] == ["llama", ""]
    assert content_error(bad_model_code) == "labels.model: code out of range of 2"

    def short_reason_codes(body: dict[str, Any]) -> None:
        body["reason"]["codes"] = b"\x00\x00\x00\x00"

    assert content_error(short_reason_codes) == (
        "reason.codes: expected 3 x uint32 (12 bytes), got 4 bytes"
    )


def test_declared_emission_counts_never_size_an_allocation() -> None:
    """Regression: a 608-byte body whose ``emission_counts`` claimed 2**32 - 1 emissions per
    record (and ``emission_tokens`` nil) made the decoder allocate ``np.ones`` of that many
    int32 before it looked at the deltas' length: 1 GB for one request."""
    huge = 2**24  # the documented maximum: 16 Mi int32 would be 64 MiB

    def lie(body: dict[str, Any]) -> None:
        counts = np.zeros(3, "<u4")
        counts[0] = huge
        body["emission_counts"] = counts.tobytes()
        body["num_emissions"] = huge
        body["emission_tokens"] = None

    data = reframe(encode(), lie)
    assert len(data) < 1000
    tracemalloc.start()
    try:
        message = decode_error(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message == (
        f"emission_deltas_us: expected {huge} x uint32 ({4 * huge} bytes), got 20 bytes"
    )
    assert peak < 64 * len(data) + 200_000, peak


def test_int64_deltas_are_checked_for_sign_and_overflow() -> None:
    def deltas(values: list[int]) -> Callable[[dict[str, Any]], None]:
        def mutate(body: dict[str, Any]) -> None:
            body["emission_deltas_type"] = "i64"
            body["emission_deltas_us"] = np.array(values, "<i8").tobytes()

        return mutate

    assert (
        content_error(deltas([1, 2, 3, -4, 5])) == "emission_deltas_us: deltas must be >= 0, got -4"
    )
    huge = 2**62
    assert content_error(deltas([1, 2, 3, huge, huge])) == (
        "emission_deltas_us: token times overflow int64 µs after arrival"
    )


def test_encoding_refuses_an_invalid_batch_naming_the_field() -> None:
    batch = sample_batch()
    batch.emission_offsets_us[1] = 10  # goes backwards inside request r0
    with pytest.raises(WireError) as exc:
        encode(batch)
    assert str(exc.value) == (
        "emission_offsets_us: non-monotonic token times in request 'r0' at emission 1"
    )
    batch = sample_batch()
    batch.arrival_time_ns = batch.arrival_time_ns.astype(np.float64)  # type: ignore[assignment]
    with pytest.raises(WireError, match=r"^arrival_time_ns: expected dtype int64, got float64$"):
        encode(batch)
    batch = sample_batch()
    batch.phase_offsets_us[0, 2] = -7
    with pytest.raises(WireError) as exc:
        batch_to_json(batch, exporter_id="gw-0", seq=1)
    assert (
        str(exc.value) == "phase_offsets_us: must be >= 0 (µs after arrival) or -1 (absent), got -7"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"exporter_id": "", "seq": 1},
            "exporter_id: must be a non-empty string of at most 256 characters, got ''",
        ),
        ({"exporter_id": "gw", "seq": -1}, "seq: must be an integer in [0, 2**63 - 1], got -1"),
        ({"exporter_id": "gw", "seq": True}, "seq: must be an integer in [0, 2**63 - 1], got True"),
        (
            {"exporter_id": "gw", "seq": 1, "sent_time_ns": 2**63},
            f"sent_time_ns: must be an integer in [0, 2**63 - 1], got {2**63}",
        ),
    ],
)
def test_encoding_refuses_an_invalid_header(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(WireError) as exc:
        encode_batch(sample_batch(), **kwargs)
    assert str(exc.value) == message


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_bodies_with_a_valid_checksum_raise_only_wire_errors(data: st.DataObject) -> None:
    body = bytearray(msgpack.unpackb(encode())["body"])
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    sealed = msgpack.packb({"v": 1, "crc32": zlib.crc32(bytes(body)), "body": bytes(body)})
    try:
        header, batch = decode_batch(sealed)
    except WireError:
        return
    batch.validate()  # whatever decodes honours the contract
    assert header.exporter_id


# --- JSON-specific refusals ---------------------------------------------------------------


def json_error(mutate: Callable[[dict[str, Any]], None], **kwargs: Any) -> str:
    obj = batch_to_json(sample_batch(), exporter_id="gw-0", seq=3, sent_time_ns=5)
    mutate(obj)
    with pytest.raises(WireError) as exc:
        batch_from_json(obj, **kwargs)
    return str(exc.value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (set_field("kv_bytes", [0, 0]), "kv_bytes: expected 3 values, got 2"),
        (set_field("kv_bytes", [0, True, 0]), "kv_bytes: expected a list of integers"),
        (set_field("kv_bytes", [0, 1.5, 0]), "kv_bytes: expected a list of integers"),
        (set_field("kv_bytes", [0, 2**64, 0]), f"kv_bytes: values must be in [0, {2**63 - 1}]"),
        (
            set_field("prompt_tokens", [0, 2**31, 0]),
            f"prompt_tokens: values must be in [0, {2**31 - 1}], got {2**31}",
        ),
        (
            set_field("status", ["ok", "great", "ok"]),
            "status: unknown value 'great'; "
            "allowed: ['in_flight', 'ok', 'error', 'aborted', 'rejected']",
        ),
        (set_field("final", [1, 0, 1]), "final: expected a list of booleans"),
        (
            set_field("emission_offsets_us", [[1], [2, 3]]),
            "emission_offsets_us: expected 3 values, got 2",
        ),
        (
            lambda obj: obj.update(emission_offsets_us=[[5, 1], [], []], emission_tokens=None),
            "emission_offsets_us: non-monotonic token times in request 'r0' at emission 1",
        ),
        (
            lambda obj: obj.update(emission_offsets_us=[[-5], [], []], emission_tokens=None),
            f"emission_offsets_us: values must be in [0, {2**63 - 1}], got -5",
        ),
        (
            set_field("emission_tokens", [[1, 1, 1], [1], []]),
            "emission_tokens: request 'r1' has 1 token counts for 2 emissions",
        ),
        (
            set_field("emission_tokens", [[1, 1, 1], [1, 0], []]),
            f"emission_tokens: values must be in [1, {2**31 - 1}], got 0",
        ),
        (lambda obj: obj["labels"].pop("slo"), "labels.slo: missing"),
        (
            lambda obj: obj["phase_offsets_us"].update(decode=[0, 0, 0]),
            "phase_offsets_us: unknown fields ['decode']; allowed: "
            "['queued', 'prefill_start', 'prefill_end', 'kv_handoff_start', 'kv_handoff_end', "
            "'finished']",
        ),
        (lambda obj: obj.pop("v"), "v: missing"),
    ],
)
def test_inconsistent_json_is_refused(
    mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    assert json_error(mutate) == message


def test_json_record_limit_and_unparseable_text() -> None:
    assert json_error(lambda obj: None, max_records=2) == (
        "request_ids: 3 records exceed max_records 2"
    )
    with pytest.raises(WireError) as exc:
        decode_any(b"{not json", CONTENT_TYPE_JSON)
    assert str(exc.value) == (
        "batch: invalid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1))"
    )
    with pytest.raises(WireError) as exc:
        batch_from_json([1, 2])
    assert str(exc.value) == "batch: expected a JSON object, got list"
