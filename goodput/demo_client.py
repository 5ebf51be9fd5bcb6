"""The demo scenario's client: an open loop of streamed completions with token-id prompts.

:class:`OpenLoop` sends Poisson arrivals at a rate that can change while it runs (an open
loop: it never waits for answers, so an overload builds a queue, as real users do), each
request with a priority class (``x-goodput-priority``) and the SLO key
(``x-goodput-slo``), and keeps every request's :class:`Outcome`. Prompts are token ids
(counted exactly by the gateway and the engine), random per request id, so that no prefix
cache entry or KV hand-off is shared. :func:`closed_loop` sends requests one at a time:
the service time of an idle stack. Private to the demo (goodput/demo_scenario.py) and the
live control tests.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

__all__ = ["OpenLoop", "Outcome", "closed_loop", "send_one"]

CLASSES = ("critical", "standard", "sheddable")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as the client saw it (times in seconds since the loop started)."""

    index: int
    priority: str
    gateway: str
    status: int  # HTTP status; 0: the connection failed
    sent_s: float
    end_s: float
    ttft_s: float | None  # to the first chunk with text, for 200s
    max_itl_s: float | None  # the largest gap between chunks with text
    complete: bool  # a 200 whose stream ended with a finish reason and [DONE]
    retry_after: str | None = None
    error: dict[str, Any] | None = None  # the JSON error body of a non-200
    cancelled: bool = False  # still in flight when the loop's drain ended (status 0)


def prompt(request_id: str, num_tokens: int) -> list[int]:
    """``num_tokens`` token ids drawn from a generator seeded by ``request_id``: no two
    requests share a 128-token block, so none reads KV another one wrote (a prompt that
    extends another's prefix would hit that prompt's KV in the shared folder)."""
    rng = np.random.default_rng(zlib.crc32(request_id.encode()))
    return [int(t) for t in rng.integers(3, 2000, size=num_tokens)]


async def send_one(
    client: httpx.AsyncClient,
    url: str,
    *,
    model: str,
    index: int,
    priority: str,
    slo: str,
    prompt_tokens: int,
    max_tokens: int,
    t0: float,
    gateway: str = "",
    id_prefix: str = "demo",
) -> Outcome:
    """Stream one completion through ``url`` and return how it went."""
    request_id = f"{id_prefix}-{index}"
    body = {"model": model, "prompt": prompt(request_id, prompt_tokens), "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "temperature": 0.0}  # fmt: skip
    headers = {"x-goodput-priority": priority, "x-goodput-slo": slo,
               "x-request-id": request_id}  # fmt: skip
    sent = time.monotonic()
    ttft: float | None = None
    last: float | None = None
    max_itl: float | None = None
    done = finished = False
    try:
        async with client.stream(
            "POST", f"{url}/v1/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                try:
                    error = json.loads(text).get("error")
                except (ValueError, AttributeError):
                    error = {"message": text[:300]}
                return Outcome(index, priority, gateway, response.status_code, sent - t0,
                               time.monotonic() - t0, None, None, False,
                               response.headers.get("retry-after"), error)  # fmt: skip
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                now = time.monotonic()
                if choices[0].get("text"):
                    if ttft is None:
                        ttft = now - sent
                    elif last is not None:
                        max_itl = max(max_itl or 0.0, now - last)
                    last = now
                if choices[0].get("finish_reason"):
                    finished = True
    except (httpx.HTTPError, ValueError) as exc:
        return Outcome(index, priority, gateway, 0, sent - t0, time.monotonic() - t0, ttft,
                       max_itl, False, None, {"message": repr(exc)[:300]})  # fmt: skip
    return Outcome(index, priority, gateway, 200, sent - t0, time.monotonic() - t0, ttft,
                   max_itl, done and finished)  # fmt: skip


def closed_loop(
    url: str,
    *,
    model: str,
    slo: str,
    count: int,
    prompt_tokens: int,
    max_tokens: int,
    id_prefix: str = "demo",
) -> list[Outcome]:
    """``count`` requests one after the other (class ``critical``: never shed)."""

    async def run() -> list[Outcome]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0)) as client:
            t0 = time.monotonic()
            return [
                await send_one(
                    client,
                    url,
                    model=model,
                    index=k,
                    priority="critical",
                    slo=slo,
                    prompt_tokens=prompt_tokens,
                    max_tokens=max_tokens,
                    t0=t0,
                    id_prefix=f"{id_prefix}-idle",
                )
                for k in range(count)
            ]

    return asyncio.run(run())


@dataclass
class OpenLoop:
    """Poisson arrivals at ``rate_rps`` to ``url`` on a thread of its own, until
    :meth:`stop`. ``rate_rps`` and ``url`` may be changed while it runs; every request's
    class is drawn from ``mix`` (class → share)."""

    url: str
    model: str
    slo: str
    rate_rps: float
    prompt_tokens: tuple[int, int]  # uniform in [low, high]
    max_tokens: int
    mix: dict[str, float] = field(default_factory=lambda: {"standard": 0.5, "sheddable": 0.5})
    gateway: str = ""
    seed: int = 0
    id_prefix: str = "demo"
    timeout_s: float = 120.0
    outcomes: list[Outcome] = field(default_factory=list)
    on_outcome: Callable[[Outcome], None] | None = None
    t0: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _sent: int = 0
    _drain_s: float = 60.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()),
                                        name="goodput-demo-client", daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self, drain_s: float = 60.0) -> None:
        """Stop sending, wait up to ``drain_s`` for the requests in flight, cancel the rest."""
        self._drain_s = drain_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(drain_s + 10.0)

    @property
    def sent(self) -> int:
        return self._sent

    def in_flight(self) -> int:
        return self._sent - len(self.outcomes)

    async def _run(self) -> None:
        rng = np.random.default_rng(self.seed)
        classes = list(self.mix)
        shares = np.array([self.mix[c] for c in classes], dtype=np.float64)
        shares /= shares.sum()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        timeout = httpx.Timeout(self.timeout_s, connect=10.0)
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            index = 0
            while not self._stop.is_set():
                await asyncio.sleep(float(rng.exponential(1.0 / max(self.rate_rps, 1e-3))))
                if self._stop.is_set():
                    break
                priority = str(classes[int(rng.choice(len(classes), p=shares))])
                length = int(rng.integers(self.prompt_tokens[0], self.prompt_tokens[1] + 1))
                task = asyncio.create_task(self._one(client, index, priority, length))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                index += 1
                self._sent = index
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=self._drain_s)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    async def _one(self, client: httpx.AsyncClient, index: int, priority: str, length: int) -> None:
        sent = time.monotonic() - self.t0
        try:
            outcome = await send_one(
                client, self.url, model=self.model, index=index, priority=priority,
                slo=self.slo, prompt_tokens=length, max_tokens=self.max_tokens, t0=self.t0,
                gateway=self.gateway, id_prefix=self.id_prefix,
            )  # fmt: skip
        except asyncio.CancelledError:
            # Cancelled at the end of the drain: kept in the outcomes, so that a phase's
            # counts add up to what it sent.
            message = f"cancelled: still in flight {self._drain_s:g} s after the loop stopped"
            self.outcomes.append(Outcome(index, priority, self.gateway, 0, sent,
                                         time.monotonic() - self.t0, None, None, False,
                                         error={"message": message}, cancelled=True))  # fmt: skip
            raise
        self.outcomes.append(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
