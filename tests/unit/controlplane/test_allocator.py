"""``serve`` fixes glibc's mmap threshold itself, unless told not to or the operator did."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import pytest
from typer.testing import CliRunner

import controlplane.allocator as allocator
import controlplane.main
from controlplane.allocator import (
    DEFAULT_TRIM_THRESHOLD,
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    fix_mmap_threshold,
    start_trimming,
)
from controlplane.settings import Settings
from goodput.cli import app

GLIBC = hasattr(ctypes.CDLL(None), "mallopt") if os.name == "posix" else False


class Mallopt:
    """Stands in for glibc's ``mallopt``: records its calls, answers ``result``."""

    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def __call__(self, option: int, value: int) -> int:
        self.calls.append((option, value))
        return self.result


@pytest.fixture
def mallopt(monkeypatch: pytest.MonkeyPatch) -> Mallopt:
    fake = Mallopt()
    monkeypatch.setattr(allocator, "_mallopt", lambda: fake)
    return fake


MMAP_AND_TRIM = [(M_MMAP_THRESHOLD, 131_072), (M_TRIM_THRESHOLD, 262_144)]


def test_sets_the_threshold_with_mallopt(mallopt: Mallopt) -> None:
    assert fix_mmap_threshold(131_072, {}) is True
    # The trim threshold at twice the mmap threshold, as glibc's dynamic adjustment sets it.
    assert mallopt.calls == MMAP_AND_TRIM
    assert (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD) == (-3, -1, 131_072)


@pytest.mark.parametrize(
    ("threshold", "trim"), [(1, 131_072), (65_536, 131_072), (32 * 2**20, 64 * 2**20)]
)
def test_the_trim_threshold_goes_with_it(threshold: int, trim: int) -> None:
    assert allocator.trim_threshold_for(threshold) == trim


@pytest.mark.parametrize(
    "environ",
    [
        {"MALLOC_TRIM_THRESHOLD_": "1048576"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"},
    ],
)
def test_the_operators_trim_threshold_is_kept(mallopt: Mallopt, environ: dict[str, str]) -> None:
    assert fix_mmap_threshold(131_072, environ) is True
    assert mallopt.calls == [(M_MMAP_THRESHOLD, 131_072)]


@pytest.mark.parametrize(
    "environ",
    [
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
        {"MALLOC_MMAP_THRESHOLD_": ""},
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"},
    ],
)
def test_the_operators_threshold_is_kept(mallopt: Mallopt, environ: dict[str, str]) -> None:
    assert fix_mmap_threshold(131_072, environ) is False
    assert mallopt.calls == []


def test_other_tunables_do_not_count(mallopt: Mallopt) -> None:
    assert fix_mmap_threshold(131_072, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is True
    assert mallopt.calls == MMAP_AND_TRIM


def test_zero_leaves_the_c_library_alone(mallopt: Mallopt) -> None:
    assert fix_mmap_threshold(0, {}) is False
    assert mallopt.calls == []


def test_a_refused_value_is_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    refusing = Mallopt(result=0)
    monkeypatch.setattr(allocator, "_mallopt", lambda: refusing)
    assert fix_mmap_threshold(131_072, {}) is False
    assert refusing.calls == [(M_MMAP_THRESHOLD, 131_072)]  # the trim threshold untouched


def test_without_mallopt_it_skips_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMallopt:
        """A C library handle without ``mallopt`` (musl, say): ``CDLL(None)`` opens it."""

        def __init__(self, name: object) -> None:
            self.name = name

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert allocator._mallopt() is None
    assert fix_mmap_threshold(131_072, {}) is False


def test_a_process_without_a_handle_skips_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_handle(name: object) -> None:
        raise TypeError("expected str, got NoneType")  # what Windows says

    monkeypatch.setattr(ctypes, "CDLL", no_handle)
    assert fix_mmap_threshold(131_072, {}) is False


@pytest.mark.skipif(not GLIBC, reason="needs glibc's mallopt")
def test_glibc_accepts_it() -> None:
    assert fix_mmap_threshold(131_072, {}) is True


def test_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOODPUT_MALLOC_MMAP_THRESHOLD", raising=False)
    monkeypatch.delenv("GOODPUT_MALLOC_TRIM_INTERVAL_S", raising=False)
    assert Settings().malloc_mmap_threshold == 32 * 2**20 == allocator.MAX_MMAP_THRESHOLD
    assert Settings().malloc_trim_interval_s == 5.0
    monkeypatch.setenv("GOODPUT_MALLOC_MMAP_THRESHOLD", "0")
    assert Settings().malloc_mmap_threshold == 0
    with pytest.raises(ValueError, match="malloc_mmap_threshold"):
        Settings(malloc_mmap_threshold=allocator.MAX_MMAP_THRESHOLD + 1)
    with pytest.raises(ValueError, match="malloc_trim_interval_s"):
        Settings(malloc_trim_interval_s=-1)


@pytest.mark.parametrize(("threshold", "operator"), [("131072", None), ("0", "65536")])
def test_serve_calls_it_first(
    monkeypatch: pytest.MonkeyPatch, threshold: str, operator: str | None
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(
        allocator, "fix_mmap_threshold", lambda t, environ: calls.append((t, dict(environ)))
    )
    monkeypatch.setattr(allocator, "start_trimming", calls.append)
    monkeypatch.setattr(controlplane.main, "configure_logging", lambda settings: None)
    monkeypatch.setattr("uvicorn.run", lambda app, **kwargs: calls.append("uvicorn.run"))
    env = {
        "GOODPUT_MALLOC_MMAP_THRESHOLD": threshold,
        "MALLOC_MMAP_THRESHOLD_": operator,
        "GOODPUT_MALLOC_TRIM_INTERVAL_S": "2.5",
    }
    result = CliRunner().invoke(
        app, ["--database-url", "sqlite://", "controlplane", "serve", "--no-migrate"], env=env
    )
    assert result.exit_code == 0, result.output
    (t, environ), interval_s, last = calls
    assert t == int(threshold)
    assert environ.get("MALLOC_MMAP_THRESHOLD_") == operator
    assert interval_s == 2.5
    assert last == "uvicorn.run"


def test_trimming_calls_malloc_trim_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    three = threading.Event()

    def fake_trim(pad: int) -> int:
        calls.append(pad)
        if len(calls) >= 3:
            three.set()
        return 1

    monkeypatch.setattr(allocator, "_malloc_trim", lambda: fake_trim)
    stop = start_trimming(0.01)
    assert stop is not None
    assert three.wait(5)
    stop.set()
    assert set(calls) == {0}  # no padding kept at the heap's top


def test_trimming_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_malloc_trim", lambda: pytest.fail("looked up"))
    assert start_trimming(0) is None


def test_trimming_without_malloc_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_malloc_trim", lambda: None)
    assert start_trimming(1.0) is None


@pytest.mark.skipif(not GLIBC, reason="needs glibc's malloc_trim")
def test_glibc_has_malloc_trim() -> None:
    trim = allocator._malloc_trim()
    assert trim is not None
    assert trim(0) in (0, 1)
