"""The Kubernetes manifests under ``deploy/``: each Kustomize target renders with
``kubectl kustomize`` and every object validates against the Kubernetes 1.32 API schemas
(``kubernetes-validate``, strict: unknown fields are errors); then what a reader relies on —
resources, probes on real routes, images built here, container commands the ``goodput`` CLI
accepts, the role-as-label scheme, and monitoring files equal to what the generators write.

No cluster runs here: this checks the manifests, not their behaviour (docs/deploy.md).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
TARGETS = ("base", "overlays/dev", "overlays/production")
OVERLAYS = tuple(t for t in TARGETS if t.startswith("overlays/"))
K8S_VERSION = "1.32.0"  # kubectl 1.32's API; every object must be valid there
GOODPUT = Path(sys.executable).with_name("goodput")
KUBECTL = shutil.which("kubectl")
ROLE_LABEL = "goodput.dev/role"
ROLES = {"prefill", "decode"}
POD_KINDS = {"Deployment", "Job"}
# vLLM's OpenAI server and the sim worker both serve GET /health (the worker supervisor
# polls the same path: serving/workers/launcher.py, serving/sim/worker/server.py); the vLLM
# worker's readiness server serves /ready (serving/workers/readiness.py).
WORKER_ROUTES = {"/health", "/metrics", "/ready"}

needs_kubectl = pytest.mark.skipif(
    KUBECTL is None,
    reason="kubectl is not installed (no Debian package on bookworm): the manifests cannot be "
    "rendered here",
)


@cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "kustomize", str(DEPLOY / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, f"kubectl kustomize deploy/{target} failed:\n{out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def pod_specs(objects: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in POD_KINDS:
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def containers(objects: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, spec in pod_specs(objects):
        for container in spec.get("initContainers", []) + spec["containers"]:
            yield f"{name}/{container['name']}", container


def by_kind(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def workers(objects: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [
        o
        for o in by_kind(objects, "Deployment").values()
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    ]


# -- rendering and schema validation --


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_renders_and_validates(target: str) -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    objects = render(target)
    assert objects, f"deploy/{target} rendered nothing"
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"deploy/{target}: {obj['kind']} {obj['metadata']['name']}: {exc}")


def test_validator_rejects_a_misspelt_field() -> None:
    import kubernetes_validate

    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80, "targetport": 8080}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, K8S_VERSION, strict=True)


@needs_kubectl
def test_base_has_the_control_plane_shape() -> None:
    objects = render("base")
    hpa = by_kind(objects, "HorizontalPodAutoscaler")["goodput-controlplane"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "goodput-controlplane",
    }
    assert "replicas" not in by_kind(objects, "Deployment")["goodput-controlplane"]["spec"]
    pdb = by_kind(objects, "PodDisruptionBudget")["goodput-controlplane"]
    deployment = by_kind(objects, "Deployment")["goodput-controlplane"]
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert set(by_kind(objects, "Service")) == {"goodput-controlplane", "goodput-gateway"}


@needs_kubectl
def test_production_scales_the_control_plane_out_on_the_fleet_log() -> None:
    """Several replicas answer as one through the fleet log (docs/scale-out.md)."""
    objects = render("overlays/production")
    assert "goodput-controlplane" in by_kind(objects, "HorizontalPodAutoscaler")
    assert "goodput-controlplane" in by_kind(objects, "PodDisruptionBudget")
    assert "replicas" not in by_kind(objects, "Deployment")["goodput-controlplane"]["spec"]
    config = next(
        o for o in by_kind(objects, "ConfigMap").values()
        if o["metadata"]["name"].startswith("goodput-controlplane")
    )  # fmt: skip
    assert config["data"]["GOODPUT_FLEET_INGEST"] == "true"


@needs_kubectl
def test_dev_runs_one_control_plane() -> None:
    objects = render("overlays/dev")
    deployment = by_kind(objects, "Deployment")["goodput-controlplane"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "goodput-controlplane" not in by_kind(objects, "HorizontalPodAutoscaler")


# -- what every pod needs --


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_every_container_has_requests_and_limits(target: str) -> None:
    for name, container in containers(render(target)):
        resources = container.get("resources", {})
        for bound in ("requests", "limits"):
            missing = {"cpu", "memory"} - set(resources.get(bound, {}))
            assert not missing, f"deploy/{target} {name}: no {bound} for {sorted(missing)}"


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_no_service_links(target: str) -> None:
    """A Service named goodput-X would add GOODPUT_X_PORT=tcp://... to the environment,
    where the GOODPUT_-prefixed settings read their values."""
    for name, spec in pod_specs(render(target)):
        assert spec.get("enableServiceLinks") is False, f"deploy/{target} {name}"


@cache
def app_routes(subcommand: str) -> frozenset[str]:
    """The paths the container's own app serves."""
    if subcommand == "controlplane serve":
        from controlplane.main import create_app
        from controlplane.settings import Settings

        app = create_app(Settings(database_url="sqlite:///:memory:"))
    elif subcommand == "gateway":
        from serving.gateway.config import GatewayConfig
        from serving.gateway.service import create_app as create_gateway

        app = create_gateway(GatewayConfig(prefill=("http://p:1",), decode=("http://d:1",)))
    else:
        assert subcommand == "worker", subcommand
        return frozenset(WORKER_ROUTES)
    return frozenset(str(getattr(route, "path", "")) for route in app.routes)


def subcommand_of(container: dict[str, Any]) -> str:
    words = []
    for arg in container.get("args", []):
        if arg.startswith("-"):
            break
        words.append(arg)
    return " ".join(words)


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_probes_hit_real_routes_on_declared_ports(target: str) -> None:
    for name, container in containers(render(target)):
        ports = {p.get("name") for p in container.get("ports", [])}
        probes = [k for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in container]
        if subcommand_of(container) == "db upgrade":
            assert not probes, name  # a Job runs to completion
            continue
        assert {"livenessProbe", "readinessProbe"} <= set(probes), f"{name}: {probes}"
        routes = app_routes(subcommand_of(container))
        for kind in probes:
            get = container[kind]["httpGet"]
            assert get["path"] in routes, f"deploy/{target} {name} {kind}: {get['path']}"
            assert get["port"] in ports, f"deploy/{target} {name} {kind}: port {get['port']}"


@needs_kubectl
def test_control_plane_readiness_is_ready() -> None:
    container = by_kind(render("base"), "Deployment")["goodput-controlplane"]["spec"]["template"]
    probes = container["spec"]["containers"][0]
    assert probes["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/health"


# -- images --


def dockerfile_titles() -> dict[str, Path]:
    titles = {}
    for dockerfile in sorted((DEPLOY / "images").glob("*.Dockerfile")):
        text = dockerfile.read_text(encoding="utf-8")
        match = re.search(r'org\.opencontainers\.image\.title="([^"]+)"', text)
        assert match, f"{dockerfile.name} has no org.opencontainers.image.title label"
        titles[match.group(1)] = dockerfile
    return titles


def test_dockerfiles_copy_what_exists() -> None:
    titles = dockerfile_titles()
    assert set(titles) == {"goodput", "goodput-worker"}
    for dockerfile in titles.values():
        text = dockerfile.read_text(encoding="utf-8")
        for source in re.findall(r"^COPY (?!--from)(\S+) ", text, flags=re.MULTILINE):
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}: not in the repo"
        assert 'ENTRYPOINT ["goodput"]' in text, dockerfile.name
    worker = titles["goodput-worker"].read_text(encoding="utf-8")
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v\S+$", worker, flags=re.MULTILINE)


def test_the_control_plane_image_leaves_the_allocator_to_serve() -> None:
    """``serve`` keeps an inherited ``MALLOC_MMAP_THRESHOLD_``: set in the image, it would
    replace the start-up setting (32 MiB and the trim timer) with the 128-KiB one, about 1.6
    times the CPU per ingest batch (docs/ingest.md), and no manifest sets it either."""
    image = dockerfile_titles()["goodput"].read_text(encoding="utf-8")
    assert "MALLOC_MMAP_THRESHOLD_=" not in image
    assert "GLIBC_TUNABLES" not in image
    for manifest in DEPLOY.rglob("*.yaml"):
        text = manifest.read_text(encoding="utf-8")
        assert "MALLOC_MMAP_THRESHOLD_" not in text, manifest


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_images_are_built_from_this_repository(target: str) -> None:
    titles = dockerfile_titles()
    for name, container in containers(render(target)):
        repository = container["image"].split("@")[0].rsplit(":", 1)[0]
        assert repository.rsplit("/", 1)[-1] in titles, f"deploy/{target} {name}: {repository}"


# -- container commands --


def expand(container: dict[str, Any], objects: tuple[dict[str, Any], ...]) -> list[str]:
    """The container's args as the kubelet expands them, with stand-ins for the values known
    only in a cluster; a reference to an undefined variable is a test failure (the kubelet
    would pass it on literally)."""
    config_maps = by_kind(objects, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]]["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var["valueFrom"]:
            env[var["name"]] = f"secret-{var['valueFrom']['secretKeyRef']['key']}"
        else:
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = {"status.podIP": "10.0.0.7", "metadata.name": "pod-0"}.get(
                field, field
            )
    args = []
    for arg in container.get("args", []):
        for ref in re.findall(r"\$\((\w+)\)", arg):
            assert ref in env, f"{container['name']}: $({ref}) is not in its environment"
        args.append(re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg))
    return args


def role_of(deployment: dict[str, Any], args: list[str]) -> list[str]:
    role = deployment["spec"]["template"]["metadata"]["labels"][ROLE_LABEL]
    return [a.replace(f"metadata.labels['{ROLE_LABEL}']", role) for a in args]


def goodput(*args: str) -> Result:
    """Run the ``goodput`` command line (the console script's typer app) in this process."""
    from goodput.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@needs_kubectl
def test_commands_are_goodput_subcommands() -> None:
    """Each distinct command line parses: ``goodput <subcommand> <its options> --help``
    fails on an unknown option or subcommand (the workers' whole plan is checked below)."""
    seen: set[tuple[str, ...]] = set()
    for target in TARGETS:
        objects = render(target)
        for name, container in containers(objects):
            assert container["command"] == ["goodput"], f"deploy/{target} {name}"
            args = tuple(expand(container, objects))
            if subcommand_of(container) == "worker" or args in seen:
                continue
            seen.add(args)
            out = goodput(*args, "--help")
            assert out.exit_code == 0, f"deploy/{target} {name}: goodput {args}:\n{out.output}"
    assert {a[:2] for a in seen} >= {("controlplane", "serve"), ("db", "upgrade")}
    assert goodput("gateway", "--no-such-option", "--help").exit_code != 0  # the check bites


def worker_plan(
    deployment: dict[str, Any], objects: tuple[dict[str, Any], ...], *, process: bool = False
) -> Any:
    """``goodput worker <the container's args> --print-plan`` (through the installed console
    script with ``process``, else in this process: the same typer app, seconds faster)."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = [*role_of(deployment, expand(container, objects)), "--print-plan"]
    if process:
        run = subprocess.run(
            [str(GOODPUT), *args], capture_output=True, text=True, timeout=300, check=False
        )
        assert run.returncode == 0, f"goodput {args}:\n{run.stderr}"
        return json.loads(run.stdout)
    out = goodput(*args)
    assert out.exit_code == 0, f"goodput {args}:\n{out.output}"
    return json.loads(out.stdout)


@needs_kubectl
def test_gpu_workers_run_vllm_with_nixl_and_the_plugin() -> None:
    objects = render("overlays/production")
    deployment = by_kind(objects, "Deployment")["goodput-worker-decode"]
    plan = worker_plan(deployment, objects, process=True)
    argv = plan["argv"]
    assert argv[argv.index("-m") + 1] == "vllm.entrypoints.openai.api_server"
    kv_config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv_config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert argv[argv.index("--served-model-name") + 1] == "meta-llama/Llama-3.1-8B-Instruct"
    assert plan["env"]["GOODPUT_CONTROL_PLANE_URL"] == "http://goodput-controlplane:8000"
    assert plan["env"]["GOODPUT_INGEST_KEY"] == "secret-ingest"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    gpus = {b: container["resources"][b].get("nvidia.com/gpu") for b in ("requests", "limits")}
    assert gpus == {"requests": 1, "limits": 1}
    assert container["image"].endswith("/goodput-worker:0.1.0")


@needs_kubectl
def test_dev_workers_run_the_timing_model_without_gpus() -> None:
    objects = render("overlays/dev")
    for deployment in workers(objects):
        plan = worker_plan(deployment, objects)
        role = deployment["spec"]["template"]["metadata"]["labels"][ROLE_LABEL]
        assert (plan["engine"], plan["role"], plan["url"]) == ("sim", role, "http://0.0.0.0:8000")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert "nvidia.com/gpu" not in json.dumps(container["resources"])
        assert not deployment["spec"]["template"]["spec"].get("tolerations")


# -- roles as labels --


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_roles_are_pod_labels_outside_the_selectors(target: str) -> None:
    """Relabelling a pod moves it between pools; its ReplicaSet must still own it."""
    deployments = workers(render(target))
    roles = set()
    for deployment in deployments:
        template = deployment["spec"]["template"]
        role = template["metadata"]["labels"][ROLE_LABEL]
        roles.add(role)
        assert ROLE_LABEL not in deployment["spec"]["selector"]["matchLabels"]
        env = {v["name"]: v for v in template["spec"]["containers"][0]["env"]}
        field = env["GOODPUT_ROLE"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert field == f"metadata.labels['{ROLE_LABEL}']"
    assert roles == ROLES, f"deploy/{target}: worker roles {roles}"
    selectors = [json.dumps(d["spec"]["selector"], sort_keys=True) for d in deployments]
    assert len(set(selectors)) == len(selectors), "two worker Deployments share a selector"


# -- monitoring ConfigMaps --


MONITORING = DEPLOY / "base" / "monitoring"


def test_monitoring_files_are_what_the_generators_write() -> None:
    """The dashboards and the (demo SLO's) rules equal dashboards/generated/; the provisioning
    files are `goodput dashboards export --prometheus-url http://prometheus:9090`'s."""
    from dashboards.export import EXAMPLE_DIR, RULES_FILE, provisioning_files

    generated = MONITORING / "generated"
    expected = {
        p.relative_to(EXAMPLE_DIR).as_posix(): p.read_text(encoding="utf-8")
        for p in [*(EXAMPLE_DIR / "dashboards").glob("*.json"), EXAMPLE_DIR / RULES_FILE]
    }
    expected.update(provisioning_files(prometheus_url="http://prometheus:9090"))
    actual = {
        p.relative_to(generated).as_posix(): p.read_text(encoding="utf-8")
        for p in generated.rglob("*")
        if p.is_file()
    }
    assert sorted(actual) == sorted(expected)
    stale = [name for name in expected if actual[name] != expected[name]]
    assert not stale, f"run deploy/regenerate-monitoring.sh: {stale}"


def test_every_generated_file_is_in_a_config_map() -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text("utf-8"))
    listed = {
        entry.split("=", 1)[-1]
        for generator in kustomization["configMapGenerator"]
        for entry in generator["files"]
    }
    on_disk = {p.relative_to(MONITORING).as_posix() for p in MONITORING.rglob("generated/**/*")}
    assert listed == {p for p in on_disk if (MONITORING / p).is_file()}
