"""Where a server's IPC sockets go: a run folder too deep for a Unix socket path gets a
short folder of its own (vLLM dies at start-up otherwise)."""

from __future__ import annotations

from pathlib import Path

from serving.workers import VllmServer, VllmSpec


def test_a_shallow_run_dir_keeps_the_sockets_in_its_tmp(tmp_path: Path) -> None:
    run_dir = Path("/tmp") / "w"
    server = VllmServer(VllmSpec(model=tmp_path, port=8100), run_dir=run_dir)
    assert server.plan().env["VLLM_RPC_BASE_PATH"] == str((run_dir / "tmp").resolve())


def test_a_deep_run_dir_gets_a_short_socket_folder_removed_at_stop(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / "prefill-run"
    server = VllmServer(VllmSpec(model=tmp_path, port=8100), run_dir=deep)
    rpc = Path(server.plan().env["VLLM_RPC_BASE_PATH"])
    assert rpc.is_dir() and len(str(rpc)) + 1 + 36 <= 107
    assert server.plan().env["VLLM_RPC_BASE_PATH"] == str(rpc)  # one per server
    assert server.plan().env["TMPDIR"] == str(deep / "tmp")  # the rest stays in run_dir
    server.stop()
    assert not rpc.exists()
