"""The compose file, Dockerfile, Prometheus and Grafana configuration agree with the code and each other."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a tool, capturing its output."""
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def compose(docker_compose: str, load_yaml: Callable[[str], Any], repo: Path) -> dict[str, Any]:
    """The compose file as docker-compose resolves it (anchors merged, variables filled in)."""
    done = _run([docker_compose, "-f", "deploy/docker-compose.yml", "config"], repo)
    assert done.returncode == 0, done.stderr
    return load_yaml(done.stdout)


@pytest.fixture(scope="module")
def ackers(compose: dict[str, Any]) -> dict[int, tuple[str, dict[str, Any]]]:
    """Acker services by shard index: (service name, resolved service)."""
    found: dict[int, tuple[str, dict[str, Any]]] = {}
    for name, service in compose["services"].items():
        env = service.get("environment") or {}
        if "ACKER_SHARD_INDEX" in env:
            index = int(env["ACKER_SHARD_INDEX"])
            assert index not in found, f"{name} and {found[index][0]} both claim shard {index}"
            found[index] = (name, service)
    return found


def _resolved_with(
    docker_compose: str, repo: Path, load_yaml: Callable[[str], Any], env: dict[str, str]
) -> dict[str, Any]:
    """The compose file's services as docker-compose resolves them with ``env`` added to the environment."""
    done = subprocess.run(
        [docker_compose, "-f", "deploy/docker-compose.yml", "config"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return load_yaml(done.stdout)["services"]


def _port_mappings(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host ip, published, target) of a resolved service's ports, short ("ip:pub:target/tcp") or long syntax."""
    found = []
    for port in service.get("ports", []):
        if isinstance(port, str):
            host_ip, published, target = port.split("/")[0].rsplit(":", 2)
            found.append((host_ip, int(published), int(target)))
        else:
            found.append((port.get("host_ip", ""), int(port["published"]), int(port["target"])))
    return found


def _published(service: dict[str, Any]) -> list[tuple[int, int]]:
    """(published, target) port pairs of a resolved service."""
    return [(published, target) for _, published, target in _port_mappings(service)]


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a resolved service's bind mounts (short or long syntax)."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        if source.startswith("/"):
            mounts[target] = Path(source)
    return mounts


def _named_volumes(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> volume name of a resolved service's named volumes (short or long syntax)."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        if source and not source.startswith(("/", ".")):
            mounts[target] = source
    return mounts


def test_compose_file_validates(docker_compose: str, repo: Path) -> None:
    """`docker-compose config` accepts the compose file."""
    done = _run([docker_compose, "-f", "deploy/docker-compose.yml", "config", "--quiet"], repo)
    assert done.returncode == 0, done.stderr


def test_ackers_are_shards_zero_to_n_minus_one_of_n(ackers: dict[int, tuple[str, dict[str, Any]]]) -> None:
    """The acker services are shards 0..n-1, every one told the same shard count n, named acker-<i>."""
    n = len(ackers)
    assert n == 3
    assert sorted(ackers) == list(range(n))
    for index, (name, service) in ackers.items():
        assert int(service["environment"]["ACKER_SHARD_COUNT"]) == n, name
        assert name == f"acker-{index}"


def test_acker_settings_agree_across_shards(ackers: dict[int, tuple[str, dict[str, Any]]]) -> None:
    """Every shard runs the same image with the same timeout, buckets and metrics port."""
    shared = ("ACKER_MESSAGE_TIMEOUT", "ACKER_BUCKETS", "ACKER_METRICS_PORT", "ACKER_SHARD_COUNT", "ACKER_REPLICAS")
    settings = {tuple(s["environment"].get(k) for k in shared) for _, s in ackers.values()}
    assert len(settings) == 1, settings
    assert len({s.get("image") for _, s in ackers.values()}) == 1
    for name, service in ackers.values():
        assert service["build"]["dockerfile"] == "deploy/Dockerfile", name


def test_published_ports_are_unique_and_only_the_needed_ones(
    compose: dict[str, Any], ackers: dict[int, tuple[str, dict[str, Any]]]
) -> None:
    """Each acker publishes only its gRPC port, Prometheus and Grafana their UIs, the brokers theirs; no clashes."""
    published = [p for s in compose["services"].values() for p, _ in _published(s)]
    assert len(published) == len(set(published)), published
    for name, service in ackers.values():
        port = int(service["environment"]["ACKER_PORT"])
        assert _published(service) == [(port, port)], f"{name} must publish only its gRPC port"
    assert _published(compose["services"]["prometheus"]) == [(9090, 9090)]
    assert _published(compose["services"]["grafana"]) == [(3000, 3000)]
    assert _published(compose["services"]["redis"]) == [(6379, 6379)]
    assert _published(compose["services"]["rabbitmq"]) == [(5672, 5672)]
    assert set(compose["services"]) == {name for name, _ in ackers.values()} | {
        "prometheus",
        "grafana",
        "redis",
        "rabbitmq",
    }


def test_the_queue_brokers_start_only_with_their_profile_and_keep_their_data(
    compose: dict[str, Any], deploy_dir: Path
) -> None:
    """redis and rabbitmq: profile "queues", a healthcheck each, durable data volumes, guest reachable off localhost."""
    for name in ("redis", "rabbitmq"):
        service = compose["services"][name]
        assert service["profiles"] == ["queues"], name
        assert service["healthcheck"]["test"][0] == "CMD", name
        assert _named_volumes(service), f"{name} keeps its data on a named volume"
    for name, service in compose["services"].items():
        if name not in ("redis", "rabbitmq"):
            assert not service.get("profiles"), f"{name} must start with a plain `up`"
    assert "--appendonly" in compose["services"]["redis"]["command"]
    conf = deploy_dir / "rabbitmq" / "10-acker.conf"
    assert "loopback_users = none" in conf.read_text()
    assert _bind_mounts(compose["services"]["rabbitmq"]) == {"/etc/rabbitmq/conf.d/10-acker.conf": conf}


def test_ports_are_published_on_loopback_unless_told_otherwise(
    docker_compose: str, repo: Path, compose: dict[str, Any], load_yaml: Callable[[str], Any]
) -> None:
    """By default every port is published on 127.0.0.1 only; ACKER_PUBLISH_HOST and the *_PORT variables move them."""
    for name, service in compose["services"].items():
        assert {ip for ip, _, _ in _port_mappings(service)} == {"127.0.0.1"}, name
    env = {"ACKER_PUBLISH_HOST": "0.0.0.0", "ACKER_1_PORT": "17101", "PROMETHEUS_PORT": "19090"}
    moved = _resolved_with(docker_compose, repo, load_yaml, env)
    assert _port_mappings(moved["acker-1"]) == [("0.0.0.0", 17101, 7101)]
    assert _port_mappings(moved["prometheus"]) == [("0.0.0.0", 19090, 9090)]


def test_replication_is_one_setting_for_every_acker(
    docker_compose: str, repo: Path, ackers: dict[int, tuple[str, dict[str, Any]]], load_yaml: Callable[[str], Any]
) -> None:
    """ACKER_REPLICAS defaults to 1 and, set to 2, reaches every acker (the node-loss case runs that way)."""
    assert {s["environment"]["ACKER_REPLICAS"] for _, s in ackers.values()} == {"1"}
    services = _resolved_with(docker_compose, repo, load_yaml, {"ACKER_REPLICAS": "2"})
    assert {services[name]["environment"]["ACKER_REPLICAS"] for name, _ in ackers.values()} == {"2"}


def test_images_default_to_the_shipped_ones(
    compose: dict[str, Any], ackers: dict[int, tuple[str, dict[str, Any]]]
) -> None:
    """Without ACKER_IMAGE / PROMETHEUS_IMAGE the ackers use pyspark-acker:latest and Prometheus the upstream image."""
    assert {s["image"] for _, s in ackers.values()} == {"pyspark-acker:latest"}
    assert compose["services"]["prometheus"]["image"].startswith("prom/prometheus:")


def test_every_acker_has_a_healthcheck_probing_its_own_port(
    ackers: dict[int, tuple[str, dict[str, Any]]],
) -> None:
    """Each acker's compose healthcheck runs acker-healthcheck against its own gRPC port."""
    for name, service in ackers.values():
        test = service["healthcheck"]["test"]
        assert test[:2] == ["CMD", "acker-healthcheck"], name
        port = service["environment"]["ACKER_PORT"]
        assert test[test.index("--address") + 1] == f"127.0.0.1:{port}", name


def test_prometheus_targets_are_the_ackers(
    tool: Callable[[str], str], deploy_dir: Path, ackers: dict[int, tuple[str, dict[str, Any]]]
) -> None:
    """The acker scrape job targets every acker service's metrics port, labelled with its shard index."""
    # Static targets are known at once, but the command always waits out its --timeout.
    cmd = [
        tool("promtool"),
        "check",
        "service-discovery",
        "--timeout=2s",
        "prometheus/prometheus.yml",
        "acker",
    ]
    done = _run(cmd, deploy_dir)
    assert done.returncode == 0, done.stderr
    targets = {(t["labels"]["__address__"], t["labels"]["shard"]) for t in json.loads(done.stdout)}
    expected = {
        (f"{name}:{service['environment']['ACKER_METRICS_PORT']}", str(index))
        for index, (name, service) in ackers.items()
    }
    assert targets == expected


def test_promtool_accepts_the_prometheus_config(tool: Callable[[str], str], deploy_dir: Path) -> None:
    """`promtool check config` accepts prometheus.yml (and the rule file it names)."""
    done = _run([tool("promtool"), "check", "config", "prometheus/prometheus.yml"], deploy_dir)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_accepts_the_alert_rules(tool: Callable[[str], str], deploy_dir: Path) -> None:
    """`promtool check rules` accepts alerts.yml, and it has the required alerts."""
    done = _run([tool("promtool"), "check", "rules", "prometheus/alerts.yml"], deploy_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (deploy_dir / "prometheus" / "alerts.yml").read_text()
    for alert in (
        "AckerDown",
        "AckerTimeoutsRising",
        "AckerOutcomesDropped",
        "AckerPendingGrowing",
        "AckerMassTimeout",
    ):
        assert f"alert: {alert}" in text


def test_grafana_provisioning_matches_compose(
    compose: dict[str, Any], load_yaml: Callable[[str], Any], deploy_dir: Path
) -> None:
    """Grafana's datasource points at the compose Prometheus, and the dashboard uses that datasource."""
    sources = load_yaml((deploy_dir / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    dashboard = json.loads((deploy_dir / "grafana/dashboards/acker.json").read_text())
    uids = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert uids == {source["uid"]}
    providers = load_yaml((deploy_dir / "grafana/provisioning/dashboards/acker.yml").read_text())
    (provider,) = providers["providers"]
    mounts = _bind_mounts(compose["services"]["grafana"])
    assert mounts[provider["options"]["path"]] == (deploy_dir / "grafana" / "dashboards")
    assert mounts["/etc/grafana/provisioning"] == deploy_dir / "grafana" / "provisioning"


def test_dockerfile_installs_the_package_and_runs_unprivileged(repo: Path, deploy_dir: Path) -> None:
    """The image builds on BASE_IMAGE (python:3.11-slim unless told), installs the host's wheels when present,
    runs as a non-root user, acker-server."""
    lines = [ln.strip() for ln in (deploy_dir / "Dockerfile").read_text().splitlines()]
    instructions = [ln for ln in lines if ln and not ln.startswith("#")]
    assert instructions[0] == "ARG BASE_IMAGE=python:3.11-slim"
    assert [ln for ln in instructions if ln.startswith("FROM")] == [
        "FROM ${BASE_IMAGE} AS install",
        "FROM ${BASE_IMAGE}",
    ]
    text = "\n".join(instructions)
    # The server's dependencies are the [server] extra: from the host's wheels, or from PyPI without them.
    assert "--no-index --find-links build/docker/wheels 'pyspark-acker[server]'" in text
    assert "pip install '.[server]'" in text
    assert "COPY --from=install /opt/acker /opt/acker" in text
    # Not the demo: a server image has no pyspark, and acker-demo would only fail there.
    assert "rm -rf /opt/acker/bin/acker-demo /opt/acker/lib/python3*/site-packages/acker_demo" in text
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    users = [ln.split()[1] for ln in instructions if ln.startswith("USER")]
    assert users and users[-1] not in ("root", "0")
    assert instructions.index(f"USER {users[-1]}") < instructions.index('ENTRYPOINT ["acker-server"]')
    assert re.search(r"\bACKER_HOST=0\.0\.0\.0\b", "\n".join(instructions))
    scripts = pyproject["project"]["scripts"]
    assert {"acker-server", "acker-healthcheck"} <= set(scripts)


def _documented_command(repo: Path, marker: str) -> str:
    """The shell command in docs/deployment.md whose text contains ``marker`` (continuation lines joined)."""
    text = (repo / "docs" / "deployment.md").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if marker in line]
    return " ".join(line.split())


def test_the_registry_free_command_starts_only_locally_built_images(
    docker_compose: str, repo: Path, load_yaml: Callable[[str], Any]
) -> None:
    """Issue 23: the documented `up -d` pulled Prometheus and Grafana; the registry-free one names local images only."""
    command = _documented_command(repo, "PROMETHEUS_IMAGE=pyspark-acker-prometheus")
    variable, _, rest = command.partition(" docker-compose ")
    name, _, image = variable.partition("=")
    services = rest.split(" up -d ", 1)[1].split()
    build_sh = (repo / "deploy" / "images" / "build.sh").read_text()
    assert f"PROMETHEUS_IMAGE=${{ACKER_PROMETHEUS_IMAGE:-{image}}}" in build_sh  # what make images builds
    resolved = _resolved_with(docker_compose, repo, load_yaml, {name: image})
    local = {"pyspark-acker:latest", image}
    assert {resolved[s]["image"] for s in services} <= local
    # Every service but the ones needing a registry is started, and none of those is.
    assert set(services) == {s for s, spec in resolved.items() if spec["image"] in local}


def test_reshard_override_gives_every_acker_a_layout_file_on_its_own_volume(
    docker_compose: str, load_yaml: Callable[[str], Any], repo: Path
) -> None:
    """With docker-compose.reshard.yml each of acker-0..3 keeps its layout in a named volume no other acker shares."""
    done = _run(
        [docker_compose, "-f", "deploy/docker-compose.yml", "-f", "deploy/docker-compose.reshard.yml", "config"], repo
    )
    assert done.returncode == 0, done.stderr
    resolved = load_yaml(done.stdout)
    volumes = {}
    for index in range(4):
        service = resolved["services"][f"acker-{index}"]
        path = Path(service["environment"]["ACKER_LAYOUT_FILE"])
        named = [source for target, source in _named_volumes(service).items() if path.is_relative_to(target)]
        assert len(named) == 1, f"acker-{index}: {path} is not on a named volume"
        volumes[index] = named[0]
    assert len(set(volumes.values())) == 4 and set(volumes.values()) <= set(resolved["volumes"])
