"""Sim worker commands (drain, resume, set_role) and its command line's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exporters.commands import CommandKind
from exporters.fleet import PoolRole
from goodput.cli import app
from serving.sim import LatencyModel, get_model, kv_capacity_tokens
from serving.sim.instance import InstanceConfig
from serving.sim.worker.cli import SimWorkerError, SimWorkerSpec, build_worker, parse_sim_config
from serving.sim.worker.control import SimWorkerControl
from serving.sim.worker.engine import SimEngine
from serving.workers.load import WorkerLoad

runner = CliRunner()


def test_drain_reports_draining_until_idle_then_drained_and_resume_undoes_it() -> None:
    engine = SimEngine(LatencyModel.for_profile("h100-llama3.1-8b"), InstanceConfig())
    control = SimWorkerControl(engine, PoolRole.PREFILL)
    assert control.report().state == "ready"
    engine.load = WorkerLoad(num_requests_running=2)
    assert control.apply_command(CommandKind.DRAIN, {}).startswith("draining")
    report = control.report()
    assert (report.state, report.role, report.load["num_requests_running"]) == (
        "draining", "prefill", 2,
    )  # fmt: skip
    engine.load = WorkerLoad()
    assert control.report().state == "drained"
    control.apply_command(CommandKind.RESUME, {})
    assert control.report().state == "ready"
    detail = control.apply_command(CommandKind.SET_ROLE, {"role": "decode"})
    assert "prefill -> decode" in detail and control.report().role == "decode"
    with pytest.raises(ValueError, match="not a worker command"):
        control.apply_command(CommandKind.SET_ADMISSION_POLICY, {})


def test_sim_config_takes_the_cluster_strings_instance_keys() -> None:
    config, link = parse_sim_config("strategy=continuous,max_seqs=8,jitter=0,link=rdma-400g")
    assert (config.strategy.value, config.max_num_seqs, config.jitter_ratio, link) == (
        "continuous", 8, 0.0, "rdma-400g",
    )  # fmt: skip
    assert parse_sim_config("")[1] == "nvlink"
    with pytest.raises(SimWorkerError, match="'tp' is not an instance setting"):
        parse_sim_config("tp=2")
    with pytest.raises(SimWorkerError, match="strategy must be one of"):
        parse_sim_config("strategy=fastest")


def test_max_model_len_defaults_to_the_kv_capacity_when_smaller() -> None:
    _, settings, _, _ = build_worker(SimWorkerSpec(sim_config="kv_tokens=50000"))
    assert settings.max_model_len == 50000
    _, settings, _, _ = build_worker(SimWorkerSpec())
    assert settings.max_model_len == 131072
    with pytest.raises(SimWorkerError, match=r"--max-model-len: must be in \[2, 50000\]"):
        build_worker(SimWorkerSpec(sim_config="kv_tokens=50000", max_model_len=60000))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "a100-gpt5"], "--profile: unknown profile 'a100-gpt5'; known: h100-"),
        (["--sim-config", "gpu=a100"], "'gpu' is not an instance setting"),
        (["--max-num-seqs", "0"], "--max-num-seqs: must be >= 1"),
    ],
)
def test_the_command_line_refuses_bad_sim_options(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["worker", "--engine", "sim", "--port", "1", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_print_plan_shows_the_instance_and_starts_nothing(tmp_path: Path) -> None:
    kv_dir = tmp_path / "kv"
    result = runner.invoke(
        app,
        ["worker", "--engine", "sim", "--port", "8101", "--role", "decode", "--print-plan",
         "--sim-config", "max_seqs=12,link=rdma-400g", "--kv-dir", str(kv_dir)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert (plan["role"], plan["max_num_seqs"], plan["link"], plan["max_model_len"]) == (
        "decode", 12, "rdma-400g", 131072,
    )  # fmt: skip
    capacity = kv_capacity_tokens(get_model("llama-3.1-8b"), 1) // 16 * 16  # whole blocks
    assert plan["kv_capacity_tokens"] == capacity and plan["kv_dir"] == str(kv_dir)
    assert not kv_dir.exists()
    assert plan["fleet_tenant"] is None


def test_the_fleet_tenant_reaches_the_sim_workers_registration() -> None:
    result = runner.invoke(
        app,
        ["worker", "--engine", "sim", "--port", "8101", "--print-plan",
         "--control-plane", "http://127.0.0.1:9", "--fleet-tenant", "acme"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["fleet_tenant"] == "acme"


def test_vllm_still_needs_a_model() -> None:
    result = runner.invoke(app, ["worker", "--port", "1"])
    assert result.exit_code == 2
    assert "--model is required with --engine vllm" in result.output
