"""``goodput worker`` argument handling (``--print-plan`` starts nothing)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from goodput.cli import app

runner = CliRunner()


def test_print_plan_shows_the_launch_with_plugin_settings() -> None:
    result = runner.invoke(
        app,
        [
            "worker", "--model", "/models/tiny", "--port", "8101", "--role", "decode",
            "--kv-dir", "/shared/kv", "--cpu", "1", "--served-model-name", "tiny",
            "--control-plane", "http://cp:8000", "--agent-key", "gp_a", "--ingest-key", "gp_i",
            "--print-plan",
        ],
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    argv = plan["argv"]
    assert argv[argv.index("--port") + 1] == "8101"
    kv_config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv_config["kv_role"] == "kv_both"
    assert kv_config["kv_connector_extra_config"] == {"shared_storage_path": "/shared/kv"}
    assert plan["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert plan["env"]["GOODPUT_CONTROL_PLANE_URL"] == "http://cp:8000"
    assert plan["env"]["GOODPUT_INGEST_KEY"] == "gp_i"


def test_nice_is_in_the_plan_and_bounded() -> None:
    result = runner.invoke(
        app, ["worker", "--model", "/m", "--port", "8101", "--nice", "10", "--print-plan"]
    )

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nice"] == 10
    refused = runner.invoke(app, ["worker", "--model", "/m", "--port", "1", "--nice", "20"])
    assert refused.exit_code == 2 and "--nice" in refused.output


def test_sched_idle_is_in_the_plan_and_off_by_default() -> None:
    argv = ["worker", "--model", "/m", "--port", "8101", "--print-plan"]

    assert json.loads(runner.invoke(app, argv).stdout)["sched_idle"] is False
    assert json.loads(runner.invoke(app, [*argv, "--sched-idle"]).stdout)["sched_idle"] is True


def test_unknown_engine_is_refused() -> None:
    result = runner.invoke(app, ["worker", "--model", "/m", "--port", "1", "--engine", "sglang"])

    assert result.exit_code == 2
    assert "error: --engine must be one of vllm, sim, got 'sglang'" in result.output


def test_invalid_port_is_refused_with_the_rule() -> None:
    result = runner.invoke(app, ["worker", "--model", "/m", "--port", "70000", "--print-plan"])

    assert result.exit_code == 2
    assert "error: port must be in 1..65535, got 70000" in result.output
