"""Apply control-plane commands to a worker, once each, in version order (docs/wire.md).

:class:`CommandExecutor` holds the delivery rules of the ``exporters.commands`` contract so
the transport (a poll loop today) stays thin:

* a command for another target, of a kind a worker does not take (``set_admission_policy``,
  ``set_pool_membership``), or at/after its ``expires_time_ns`` is not applied: ``ok=false``
  with the reason;
* a ``version`` lower than the last one applied for that kind is stale (``ok=false``), so a
  late redelivery cannot undo a newer decision; equal versions are applied;
* an ``id`` is applied at most once; every delivery is acknowledged (a redelivery gets the
  first answer again).

What "apply" means is the worker's: ``apply(kind, payload)`` returns a detail string or raises
an exception whose message becomes the ack's detail.

Example::

    executor = CommandExecutor("127.0.0.1:8100", supervisor.apply_command)
    ack = executor.handle(command_from_json(body))
    post(ack.to_json())
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from exporters.commands import MAX_DETAIL_CHARS, Command, CommandAck, CommandKind

__all__ = ["WORKER_COMMAND_KINDS", "ApplyFn", "CommandExecutor"]

logger = logging.getLogger(__name__)

WORKER_COMMAND_KINDS = frozenset({CommandKind.SET_ROLE, CommandKind.DRAIN, CommandKind.RESUME})
ApplyFn = Callable[[CommandKind, Mapping[str, Any]], str]


class CommandExecutor:
    """Applies commands for ``target`` through ``apply``; remembers the last ``max_ids`` ids."""

    def __init__(
        self,
        target: str,
        apply: ApplyFn,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        max_ids: int = 4096,
    ) -> None:
        if max_ids < 1:
            raise ValueError(f"max_ids must be >= 1, got {max_ids}")
        self.target = target
        self._apply = apply
        self._clock_ns = clock_ns
        self._max_ids = max_ids
        self._answers: OrderedDict[str, tuple[bool, str]] = OrderedDict()
        self._versions: dict[CommandKind, int] = {}
        self.num_applied = 0
        self.num_refused = 0

    def handle(self, command: Command) -> CommandAck:
        """Apply ``command`` if the rules allow; the acknowledgement to send back."""
        known = self._answers.get(command.id)
        if known is not None:
            self._answers.move_to_end(command.id)
            return self._ack(command, *known)
        ok, detail = self._decide(command)
        self._answers[command.id] = (ok, detail)
        while len(self._answers) > self._max_ids:
            self._answers.popitem(last=False)
        if ok:
            self.num_applied += 1
        else:
            self.num_refused += 1
            logger.warning("command %s (%s) not applied: %s", command.id, command.kind, detail)
        return self._ack(command, ok, detail)

    def _decide(self, command: Command) -> tuple[bool, str]:
        if command.target != self.target:
            return False, f"wrong target {command.target!r}: this worker is {self.target!r}"
        if command.kind not in WORKER_COMMAND_KINDS:
            allowed = sorted(k.value for k in WORKER_COMMAND_KINDS)
            return False, f"kind {command.kind.value!r} is not for a worker; allowed: {allowed}"
        if command.expired(self._clock_ns()):
            return False, "expired"
        applied = self._versions.get(command.kind)
        if applied is not None and command.version < applied:
            return False, f"stale: version {command.version} < applied version {applied}"
        try:
            detail = self._apply(command.kind, command.payload)
        except Exception as exc:  # the worker's refusal, reported to the control plane
            return False, f"{type(exc).__name__}: {exc}"
        self._versions[command.kind] = command.version
        return True, detail

    def _ack(self, command: Command, ok: bool, detail: str) -> CommandAck:
        return CommandAck(
            command_id=command.id,
            target=self.target,
            ok=ok,
            detail=detail[:MAX_DETAIL_CHARS],
            acked_time_ns=self._clock_ns(),
        )
