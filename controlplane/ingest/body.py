"""Reading an ingest request body within a size limit, gzip included.

The limit is enforced before the body is read whole: a declared ``Content-Length`` over it
is refused at once, and a streamed (chunked) body is refused as soon as it passes it. A
``Content-Encoding: gzip`` body is inflated incrementally with the same limit on its
*decoded* size, so a small compressed bomb is refused after ``max_bytes`` of output, not
after it filled memory.

Errors are domain errors mapped to HTTP in one place (``controlplane.errors``):
:class:`~controlplane.errors.PayloadTooLargeError` (413, naming the limit),
:class:`~controlplane.errors.UnsupportedMediaTypeError` (415, an unknown encoding) and
:class:`MalformedBodyError` (400, a body that is not the gzip it claims to be).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

from controlplane.errors import BadRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

__all__ = ["SUPPORTED_ENCODINGS", "MalformedBodyError", "read_limited"]

SUPPORTED_ENCODINGS = ("identity", "gzip")
_GZIP_WBITS = 16 + zlib.MAX_WBITS


class MalformedBodyError(BadRequestError):
    """A request body that cannot be read as what it claims to be (HTTP 400)."""


def _too_large(max_bytes: int, got: str, setting: str = "max_ingest_bytes") -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"body must be at most {max_bytes} bytes (setting {setting}), got {got}"
    )


def _encoding(content_encoding: str | None) -> str:
    encoding = (content_encoding or "identity").strip().lower()
    if encoding not in SUPPORTED_ENCODINGS:
        raise UnsupportedMediaTypeError(
            f"content-encoding must be one of {list(SUPPORTED_ENCODINGS)}, got {encoding!r}"
        )
    return encoding


async def read_limited(
    chunks: AsyncIterator[bytes],
    *,
    content_length: str | None,
    content_encoding: str | None,
    max_bytes: int,
    setting: str = "max_ingest_bytes",
) -> bytes:
    """The whole (decoded) body, at most ``max_bytes`` bytes before and after decoding.

    ``content_length`` / ``content_encoding`` are the request's header values (or ``None``);
    ``setting`` is the name of the limit, for the 413's message.
    """
    encoding = _encoding(content_encoding)
    if content_length is not None and content_length.isdigit() and int(content_length) > max_bytes:
        raise _too_large(max_bytes, f"Content-Length {content_length}", setting)
    parts: list[bytes] = []
    received = 0
    async for chunk in chunks:
        received += len(chunk)
        if received > max_bytes:
            raise _too_large(max_bytes, f"more than {max_bytes} bytes", setting)
        parts.append(chunk)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if encoding == "gzip":
        return gunzip_limited(data, max_bytes)
    return data


def gunzip_limited(data: bytes, max_bytes: int) -> bytes:
    """Inflate a gzip body, refusing output beyond ``max_bytes`` (413) and bad gzip (400)."""
    inflater = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise MalformedBodyError(f"body: not valid gzip ({exc})") from None
    if len(out) > max_bytes:
        raise _too_large(max_bytes, f"more than {max_bytes} bytes once decompressed")
    if not inflater.eof:
        raise MalformedBodyError("body: truncated gzip stream (the compressed data ends early)")
    if inflater.unused_data:
        raise MalformedBodyError(
            f"body: {len(inflater.unused_data)} unexpected bytes after the gzip stream"
        )
    return out
