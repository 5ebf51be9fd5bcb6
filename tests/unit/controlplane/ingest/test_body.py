"""Size-limited, gzip-aware body reading: the limit holds before the body is read whole."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Iterable

import pytest

from controlplane.errors import PayloadTooLargeError, UnsupportedMediaTypeError
from controlplane.ingest import MalformedBodyError, read_limited


class Chunks:
    """An async chunk source that records how many chunks were pulled."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = list(chunks)
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.pulled += 1
            yield chunk


async def read(
    chunks: Chunks, *, length: str | None = None, encoding: str | None = None, limit: int = 10
) -> bytes:
    return await read_limited(
        chunks.__aiter__(), content_length=length, content_encoding=encoding, max_bytes=limit
    )


async def test_reads_the_whole_body_within_the_limit() -> None:
    assert await read(Chunks([b"abc", b"defg"]), limit=7) == b"abcdefg"


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    chunks = Chunks([b"x" * 11])
    with pytest.raises(PayloadTooLargeError) as info:
        await read(chunks, length="11")
    assert info.value.message == (
        "body must be at most 10 bytes (setting max_ingest_bytes), got Content-Length 11"
    )
    assert chunks.pulled == 0


async def test_a_streamed_body_is_cut_as_soon_as_it_passes_the_limit() -> None:
    chunks = Chunks([b"12345", b"67890", b"1", b"never read"])
    with pytest.raises(PayloadTooLargeError, match="got more than 10 bytes"):
        await read(chunks)
    assert chunks.pulled == 3


async def test_gzip_is_inflated() -> None:
    assert await read(Chunks([gzip.compress(b"hello")]), encoding="gzip", limit=100) == b"hello"


async def test_a_gzip_bomb_is_refused_by_its_decoded_size() -> None:
    bomb = gzip.compress(b"\0" * 1_000_000)
    with pytest.raises(PayloadTooLargeError) as info:
        await read(Chunks([bomb]), encoding="GZIP", limit=len(bomb) + 10)
    assert info.value.message.endswith("once decompressed")


async def test_bad_and_truncated_gzip_are_400s() -> None:
    with pytest.raises(MalformedBodyError, match="body: not valid gzip"):
        await read(Chunks([b"not gzip at all"]), encoding="gzip", limit=100)
    whole = gzip.compress(b"hello world" * 10)
    with pytest.raises(MalformedBodyError, match="truncated gzip stream"):
        await read(Chunks([whole[:-12]]), encoding="gzip", limit=1000)
    with pytest.raises(MalformedBodyError, match="3 unexpected bytes after the gzip stream"):
        await read(Chunks([whole + b"abc"]), encoding="gzip", limit=1000)


async def test_an_unknown_encoding_is_415_naming_the_supported_ones() -> None:
    with pytest.raises(UnsupportedMediaTypeError) as info:
        await read(Chunks([b"x"]), encoding="br")
    assert info.value.message == "content-encoding must be one of ['identity', 'gzip'], got 'br'"
