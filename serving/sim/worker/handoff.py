"""The KV hand-off between a prefill and a decode sim worker, in the protocols vLLM uses.

A decode leg must know that its prompt's KV cache was computed elsewhere. A sim worker
understands both ways the gateway and vLLM do it:

* **``kv_transfer_params``** (vLLM's NixlConnector protocol, the GPU path): a prefill
  request carrying ``{"do_remote_decode": true}`` answers with the parameters a decode
  request needs — ``{"do_remote_prefill": true, "do_remote_decode": false,
  "remote_engine_id", "remote_host", "remote_port", "remote_block_ids", "tp_size"}`` — and
  a request carrying ``{"do_remote_prefill": true, ...}`` loads its prompt's KV from that
  engine instead of computing it;
* **a shared KV folder** (``--kv-dir``; vLLM's ExampleConnector protocol, what the gateway
  relies on today: it sends the decode leg the same body, without parameters): a request
  for a prompt whose marker is in the folder takes it (one ``unlink``: one decode leg per
  prefill) and loads the KV instead of computing it; a request that computes its prompt
  with ``max_tokens`` 1 (the gateway's prefill leg) publishes a marker named by the
  prompt's key once its prefill is done, before it answers. (So a client request of one
  token still decodes from the transferred KV: its decode leg also has ``max_tokens`` 1.)
  Markers not taken within ``max_age_s`` are removed.

Either way the decode worker charges the modelled transfer time and counts the prompt's
tokens as externally transferred (:class:`~serving.sim.worker.engine.SimEngine`).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.sim.worker.prompts import PromptInfo

__all__ = ["HandoffError", "KVHandoff", "LegPlan"]

_SUFFIX = ".simkv"


class HandoffError(ValueError):
    """Malformed ``kv_transfer_params``; the message names the field."""


@dataclass(frozen=True, slots=True)
class LegPlan:
    """What a request is in the hand-off: ``remote`` — its KV comes from another worker;
    ``publish`` — its KV is for another worker (answer with parameters / leave a marker);
    ``queried`` — it looked for a remote KV (counted as an external-cache query)."""

    remote: bool
    publish: bool
    queried: bool
    params_requested: bool


class KVHandoff:
    """One worker's side of the hand-off (see the module docstring)."""

    def __init__(
        self,
        *,
        engine_id: str,
        host: str,
        port: int,
        block_size: int,
        tp_size: int,
        folder: Path | None = None,
        max_age_s: float = 600.0,
    ) -> None:
        self.engine_id = engine_id
        self.host = host
        self.port = port
        self.block_size = block_size
        self.tp_size = tp_size
        self.folder = folder
        self.max_age_s = max_age_s
        self._publishes = 0

    def plan(self, prompt: PromptInfo, params: Any, max_tokens: int) -> LegPlan:
        """What the request with these ``kv_transfer_params`` (``None`` when absent) is."""
        if params is not None and not isinstance(params, dict):
            raise HandoffError(
                f"kv_transfer_params: expected an object or null, got {type(params).__name__}"
            )
        params = params or {}
        for name in ("do_remote_prefill", "do_remote_decode"):
            if name in params and not isinstance(params[name], bool):
                raise HandoffError(f"kv_transfer_params.{name}: expected true or false")
        if params.get("do_remote_prefill") and params.get("do_remote_decode"):
            raise HandoffError(
                "kv_transfer_params: do_remote_prefill and do_remote_decode cannot both be true"
            )
        if params.get("do_remote_prefill"):
            ids = params.get("remote_block_ids")
            if ids is not None and not isinstance(ids, list):
                raise HandoffError("kv_transfer_params.remote_block_ids: expected a list")
            return LegPlan(remote=True, publish=False, queried=True, params_requested=False)
        if params.get("do_remote_decode"):
            return LegPlan(remote=False, publish=True, queried=False, params_requested=True)
        if self.folder is None:
            return LegPlan(remote=False, publish=False, queried=False, params_requested=False)
        # As ExampleConnector: look for the prompt's KV first; a request that computes it
        # with max_tokens 1 (the gateway's prefill leg) publishes it.
        remote = self._take(prompt)
        return LegPlan(remote=remote, publish=not remote and max_tokens == 1, queried=True,
                       params_requested=False)  # fmt: skip

    def response_params(self, prompt: PromptInfo) -> dict[str, Any]:
        """The ``kv_transfer_params`` a prefill leg answers with (vLLM NixlConnector's)."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_block_ids": list(range(math.ceil(prompt.tokens / self.block_size))),
            "tp_size": self.tp_size,
        }

    def publish(self, prompt: PromptInfo) -> None:
        """Leave the prompt's marker in the shared folder (atomically: write, rename)."""
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{prompt.key}{_SUFFIX}"
        staging = self.folder / f".{prompt.key}.{os.getpid()}.tmp"
        record = {"prompt_tokens": prompt.tokens, "engine_id": self.engine_id,
                  "created": time.time()}  # fmt: skip
        staging.write_text(json.dumps(record), encoding="utf-8")
        os.replace(staging, path)
        self._publishes += 1
        if self._publishes % 256 == 1:
            self.collect_garbage()

    def _take(self, prompt: PromptInfo) -> bool:
        assert self.folder is not None
        try:
            (self.folder / f"{prompt.key}{_SUFFIX}").unlink()
        except FileNotFoundError:
            return False
        return True

    def collect_garbage(self, now: float | None = None) -> int:
        """Remove markers (and staging files) older than ``max_age_s``; how many."""
        if self.folder is None or not self.folder.is_dir():
            return 0
        limit = (time.time() if now is None else now) - self.max_age_s
        removed = 0
        for path in self.folder.iterdir():
            if not (path.name.endswith(_SUFFIX) or path.name.endswith(".tmp")):
                continue
            try:
                if path.stat().st_mtime < limit:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed
