"""``goodput worker``'s Kubernetes options are checked before anything starts."""

from __future__ import annotations

from typer.testing import CliRunner

from goodput.cli import app

runner = CliRunner()
BASE = ["worker", "--model", "/m", "--port", "8101"]
AGENT = ["--control-plane", "http://cp:8000", "--agent-key", "gp_a"]
NO_POD = {"POD_NAME": "", "POD_NAMESPACE": ""}


def test_relabel_needs_the_control_plane_and_the_pod() -> None:
    alone = runner.invoke(app, [*BASE, "--kubernetes-relabel"], env=NO_POD)
    no_pod = runner.invoke(app, [*BASE, *AGENT, "--kubernetes-relabel"], env=NO_POD)

    assert alone.exit_code == 2
    assert "--kubernetes-relabel needs --control-plane" in alone.output
    assert no_pod.exit_code == 2
    assert "--kubernetes-relabel needs --pod-name (or POD_NAME) to be set" in no_pod.output


def test_relabel_outside_a_pod_says_how_to_reach_an_api_server() -> None:
    env = {**NO_POD, "POD_NAME": "w-1", "KUBERNETES_SERVICE_HOST": ""}
    result = runner.invoke(app, [*BASE, *AGENT, "--kubernetes-relabel"], env=env)

    assert result.exit_code == 2
    assert "KUBERNETES_SERVICE_HOST is not set: not running in a pod" in result.output


def test_a_bad_api_url_is_refused_for_both_engines() -> None:
    bad = runner.invoke(
        app,
        [*BASE, *AGENT, "--kubernetes-relabel", "--pod-name", "w-1", "--kubernetes-api", "x"],
    )
    sim = runner.invoke(
        app,
        ["worker", "--engine", "sim", "--port", "1", *AGENT, "--kubernetes-relabel",
         "--pod-name", "w-1", "--kubernetes-api", "x"],
    )  # fmt: skip

    assert bad.exit_code == 2
    assert "--kubernetes-api must start with http:// or https://, got 'x'" in bad.output
    assert sim.exit_code == 2
    assert "--kubernetes-api must start with http:// or https://, got 'x'" in sim.output
