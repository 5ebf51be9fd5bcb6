"""Command delivery rules on the worker side (docs/wire.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporters.commands import AdmissionPolicy, Command, CommandKind
from serving.workers import CommandExecutor

NOW = 1_700_000_000_000_000_000
TARGET = "127.0.0.1:8100"


class Worker:
    def __init__(self) -> None:
        self.applied: list[tuple[CommandKind, dict[str, Any]]] = []

    def apply(self, kind: CommandKind, payload: Mapping[str, Any]) -> str:
        if kind is CommandKind.SET_ROLE and payload["role"] == "prefill" and self.applied:
            raise RuntimeError("busy")
        self.applied.append((kind, dict(payload)))
        return f"applied {kind.value}"


def _command(kind: CommandKind, payload: Mapping[str, Any], version: int = 1, **kw: Any) -> Command:
    return Command.new(
        kind, kw.get("target", TARGET), payload, version=version, now_ns=NOW, ttl_s=30.0
    )


def _executor(worker: Worker, now: int = NOW + 1) -> CommandExecutor:
    return CommandExecutor(TARGET, worker.apply, clock_ns=lambda: now)


def test_a_command_is_applied_once_and_every_delivery_is_acked() -> None:
    worker = Worker()
    executor = _executor(worker)
    drain = _command(CommandKind.DRAIN, {})

    first = executor.handle(drain)
    again = executor.handle(drain)

    assert worker.applied == [(CommandKind.DRAIN, {})]
    assert (first.ok, first.detail, first.command_id, first.target) == (
        True,
        "applied drain",
        drain.id,
        TARGET,
    )
    assert (again.ok, again.detail) == (True, "applied drain")
    assert executor.num_applied == 1


def test_a_stale_version_is_refused_an_equal_one_applied() -> None:
    worker = Worker()
    executor = _executor(worker)
    executor.handle(_command(CommandKind.SET_ROLE, {"role": "decode"}, version=5))

    stale = executor.handle(_command(CommandKind.SET_ROLE, {"role": "both"}, version=4))
    equal = executor.handle(_command(CommandKind.SET_ROLE, {"role": "both"}, version=5))
    other_kind = executor.handle(_command(CommandKind.DRAIN, {}, version=1))

    assert (stale.ok, stale.detail) == (False, "stale: version 4 < applied version 5")
    assert equal.ok and other_kind.ok
    assert [kind for kind, _ in worker.applied] == [
        CommandKind.SET_ROLE,
        CommandKind.SET_ROLE,
        CommandKind.DRAIN,
    ]


def test_expired_wrong_target_and_gateway_commands_are_not_applied() -> None:
    worker = Worker()
    late = _executor(worker, now=NOW + 30 * 10**9)
    executor = _executor(worker)
    policy = AdmissionPolicy(version=1, ttl_s=30.0, fallback_max_concurrency=8)

    expired = late.handle(_command(CommandKind.RESUME, {}))
    elsewhere = executor.handle(_command(CommandKind.DRAIN, {}, target="10.0.0.9:8100"))
    gateway = executor.handle(_command(CommandKind.SET_ADMISSION_POLICY, {"policy": policy}))

    assert worker.applied == []
    assert (expired.ok, expired.detail) == (False, "expired")
    assert elsewhere.detail == "wrong target '10.0.0.9:8100': this worker is '127.0.0.1:8100'"
    assert gateway.detail == (
        "kind 'set_admission_policy' is not for a worker; allowed: ['drain', 'resume', 'set_role']"
    )
    assert executor.num_refused == 2


def test_a_refusal_by_the_worker_is_acked_with_its_reason() -> None:
    worker = Worker()
    executor = _executor(worker)
    executor.handle(_command(CommandKind.DRAIN, {}))

    ack = executor.handle(_command(CommandKind.SET_ROLE, {"role": "prefill"}))

    assert (ack.ok, ack.detail) == (False, "RuntimeError: busy")
    ok = executor.handle(_command(CommandKind.SET_ROLE, {"role": "decode"}, version=1))
    assert ok.ok  # a refused command did not record its version
