"""The time bound of :class:`controlplane.api.limits.RequestLimits` on a toy ASGI app."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from controlplane.api.limits import RequestLimits
from controlplane.settings import Settings


async def slow(_: Request) -> PlainTextResponse:
    await asyncio.sleep(10)
    return PlainTextResponse("late")


async def stream(_: Request) -> StreamingResponse:
    async def body():  # type: ignore[no-untyped-def]
        for _ in range(3):
            await asyncio.sleep(0.1)
            yield b"tick\n"

    return StreamingResponse(body())


def client() -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/slow", slow), Route("/stream", stream)])
    limited = RequestLimits(app, Settings(request_timeout_s=0.2))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=limited), base_url="http://t")


async def test_a_handler_that_does_not_answer_in_time_is_503_with_retry_after() -> None:
    async with client() as http:
        started = asyncio.get_running_loop().time()
        response = await http.get("/slow")
    assert asyncio.get_running_loop().time() - started < 2
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json() == {"detail": "the request took more than 0.2 s; retry later"}


async def test_a_started_stream_is_not_cut() -> None:
    async with client() as http:
        response = await http.get("/stream")
    assert response.status_code == 200
    assert response.text == "tick\n" * 3
