"""Launch plans: one code path from a spec to vLLM's command line and environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.workers import Device, SpecError, VllmSpec, build_kv_transfer_config, build_launch

MODEL = Path("/models/tiny")
RUN = Path("/run/w0")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_cpu_with_kv_dir_uses_the_atomic_example_connector_as_kv_both() -> None:
    spec = VllmSpec(model=MODEL, port=8100, kv_dir=Path("/shared/kv"))

    assert build_kv_transfer_config(spec) == {
        "kv_connector": "AtomicExampleConnector",
        "kv_connector_module_path": "serving.workers.kv_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": "/shared/kv"},
    }


def test_plain_example_connector_when_atomic_publication_is_off() -> None:
    spec = VllmSpec(model=MODEL, port=8100, kv_dir=Path("/shared/kv"), atomic_kv=False)

    assert build_kv_transfer_config(spec) == {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": "/shared/kv"},
    }


def test_cuda_uses_nixl_and_the_gpu_index() -> None:
    spec = VllmSpec(model=MODEL, port=8100, device=Device.CUDA, cpu=3, nixl_side_channel_port=5601)
    plan = build_launch(spec, run_dir=RUN, base_env={})

    assert json.loads(_flag(plan.argv, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
    }
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert plan.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert plan.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plan.env


def test_colocated_cpu_instance_has_no_connector() -> None:
    plan = build_launch(VllmSpec(model=MODEL, port=8100), run_dir=RUN, base_env={})

    assert "--kv-transfer-config" not in plan.argv


def test_cpu_plan_has_its_own_folders_binding_and_offline_env() -> None:
    spec = VllmSpec(
        model=MODEL,
        port=8101,
        cpu=1,
        kv_cache_gib=2,
        max_num_seqs=4,
        served_model_name="tiny",
        engine_env={"GOODPUT_CONTROL_PLANE_URL": "http://cp:8000"},
        extra_args=("--seed", "7"),
    )
    plan = build_launch(spec, run_dir=RUN, python="/venv/bin/python", base_env={"PATH": "/bin"})

    assert plan.argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(plan.argv, "--model") == "/models/tiny"
    assert _flag(plan.argv, "--port") == "8101"
    assert _flag(plan.argv, "--served-model-name") == "tiny"
    assert _flag(plan.argv, "--max-num-seqs") == "4"
    assert "--enforce-eager" in plan.argv
    assert plan.argv[-2:] == ["--seed", "7"]
    assert plan.env == {
        "PATH": "/bin",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TMPDIR": "/run/w0/tmp",
        "VLLM_RPC_BASE_PATH": "/run/w0/tmp",
        "VLLM_CACHE_ROOT": "/run/w0/cache",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": "1",
        "GOODPUT_CONTROL_PLANE_URL": "http://cp:8000",
    }


def test_unbound_cpu_lets_vllm_choose_and_compile_drops_eager() -> None:
    spec = VllmSpec(model=MODEL, port=8100, enforce_eager=False)
    plan = build_launch(spec, run_dir=RUN, base_env={})

    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert "--enforce-eager" not in plan.argv
    assert spec.model_name == "tiny"
    assert spec.url == "http://127.0.0.1:8100"


def test_a_parent_pid_runs_vllm_through_the_exec_wrapper() -> None:
    vllm = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    plain = build_launch(VllmSpec(model=MODEL, port=8100, nice=10), run_dir=RUN, python=vllm[0])
    assert plain.argv[:3] == vllm  # the niceness is applied once the server is ready

    plan = build_launch(VllmSpec(model=MODEL, port=8100), run_dir=RUN, python=vllm[0],
                        parent_pid=42)  # fmt: skip
    wrapper = ["/venv/bin/python", "-m", "serving._exec_child", "--parent", "42", "--"]
    assert plan.argv[:9] == [*wrapper, *vllm]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"port": 0}, "port must be in 1..65535, got 0"),
        ({"cpu": -1}, "cpu must be >= 0 (a core or GPU index), got -1"),
        ({"device": "tpu"}, "device must be one of cpu, cuda, got 'tpu'"),
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1, got 0"),
        ({"kv_cache_gib": 0}, "kv_cache_gib must be >= 1, got 0"),
        ({"nice": -5}, "nice must be in 0..19 (a lower CPU priority for the engine), got -5"),
        ({"nice": 20}, "nice must be in 0..19 (a lower CPU priority for the engine), got 20"),
        (
            {"device": "cuda", "kv_dir": Path("/kv")},
            "kv_dir is for the CPU's shared-folder connector; on cuda the KV goes through "
            "NixlConnector, got kv_dir='/kv'",
        ),
    ],
)
def test_invalid_specs_name_the_field(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"model": MODEL, "port": 8100, **kwargs}
    with pytest.raises(SpecError) as caught:
        VllmSpec(**arguments)  # type: ignore[arg-type]
    assert str(caught.value) == message
