"""docker-compose.yml parses and every service runs a real Plumb entry point.

No Docker engine runs on CI machines, so this checks what can be checked without one.
"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

from config.celery_app import app as celery_app
from devstack.management.commands.runstack import web_command

ROOT = Path(__file__).resolve().parent.parent
EXPECTED_SERVICES = {
    "redis",
    "postgres",
    "web",
    "worker-audits",
    "worker-reaudit",
    "worker-webhooks",
    "beat",
    "flower",
    "prometheus",
    "grafana",
}
# Services that run someone else's image, not Plumb's.
NOT_PLUMB = {"redis", "postgres", "prometheus", "grafana"}
MONITORING = {"prometheus", "grafana"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def command_line(service: dict) -> str:
    command = service.get("command", "")
    return " ".join(command) if isinstance(command, list) else command


def test_it_has_every_service_with_a_healthcheck(compose):
    services = compose["services"]
    assert set(services) == EXPECTED_SERVICES
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has no healthcheck"


def test_plumb_services_share_one_image_and_settings(compose):
    plumb = [s for n, s in compose["services"].items() if n not in NOT_PLUMB]
    assert {s["image"] for s in plumb} == {"plumb:latest"}
    for service in plumb:
        env = service["environment"]
        assert env["DEBUG"] == "false"
        assert env["DATABASE_URL"].startswith("postgres://")
        assert env["REDIS_URL"].startswith("redis://")


def test_every_command_names_a_real_module(compose):
    for name, service in compose["services"].items():
        if name in NOT_PLUMB:
            continue
        line = command_line(service)
        for app in re.findall(r"-A\s+(\S+)", line):
            assert hasattr(importlib.import_module(app), "celery_app"), name
        for module, attribute in re.findall(r"gunicorn\s+([\w.]+):(\w+)", line):
            assert hasattr(importlib.import_module(module), attribute), name
        for command in re.findall(r"manage\.py\s+(\w+)", line):
            assert command in get_commands(), f"{name}: no management command {command}"
        assert re.search(r"-A\s+config|gunicorn\s+config\.asgi", line), f"{name}: {line}"


def test_each_worker_consumes_exactly_one_queue(compose, settings):
    for name in ("worker-audits", "worker-reaudit", "worker-webhooks"):
        args = shlex.split(command_line(compose["services"][name]))
        queue = args[args.index("-Q") + 1]
        assert queue in settings.QUEUE_VISIBILITY_TIMEOUTS
        assert name == f"worker-{queue}"


def test_the_workers_pools_are_make_run_s_from_the_same_variables(compose, settings):
    # docker-compose substitutes ${NAME:-default} from the environment it runs in, as make
    # run reads NAME: both must name the same setting, with the same default.
    for name, pool, concurrency in (
        ("worker-audits", "AUDITS_WORKER_POOL", "AUDITS_WORKER_CONCURRENCY"),
        ("worker-reaudit", "REAUDIT_WORKER_POOL", "REAUDIT_WORKER_CONCURRENCY"),
    ):
        args = shlex.split(command_line(compose["services"][name]))
        for option, setting in (("--pool", pool), ("--concurrency", concurrency)):
            value = args[args.index(option) + 1]
            assert value == f"${{{setting}:-{getattr(settings, setting)}}}", (name, value)


def test_a_worker_s_stop_grace_outlasts_its_queue_s_longest_task(compose):
    # A restart (docker compose up, a deploy) sends SIGTERM: the worker finishes what it
    # runs. Killed before that, an audit is fetched again after the visibility timeout.
    celery_app.loader.import_default_modules()
    for name in ("worker-audits", "worker-reaudit", "worker-webhooks"):
        queue = name.removeprefix("worker-")
        limits = [
            task.time_limit or 0
            for task in celery_app.tasks.values()
            if getattr(task, "queue", None) == queue
        ]
        grace = compose["services"][name]["stop_grace_period"]
        assert grace.endswith("s")
        assert int(grace.removesuffix("s")) > max(limits), name


def test_prometheus_and_grafana_run_only_under_the_monitoring_profile(compose):
    for name, service in compose["services"].items():
        assert (service.get("profiles") == ["monitoring"]) == (name in MONITORING), name


def test_the_monitoring_services_mount_the_files_in_deploy(compose):
    # Each bind mount names a path of the checkout that exists, and the files each program
    # reads are where its command and provisioning look for them.
    mounts = {}
    for name in MONITORING:
        for volume in compose["services"][name]["volumes"]:
            source, target = volume.split(":")[:2]
            if source.startswith("./"):
                assert (ROOT / source).exists(), (name, source)
                mounts[target] = ROOT / source
    prometheus = mounts["/etc/prometheus"]
    assert (
        "--config.file=/etc/prometheus/prometheus.yml"
        in compose["services"]["prometheus"]["command"]
    )
    config = yaml.safe_load((prometheus / "prometheus.yml").read_text())
    for rule_file in config["rule_files"]:
        assert (prometheus / rule_file).is_file(), rule_file
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "plumb"  # the rules' up{job="plumb"}
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": ["web:8000"]}]

    provisioning = mounts["/etc/grafana/provisioning"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "plumb.yml").read_text())[
        "providers"
    ]
    dashboards = mounts[provider["options"]["path"]]
    assert (dashboards / "plumb.json").is_file()
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"


def test_the_web_runs_make_run_s_server_that_survives_slow_clients(compose):
    """Both serve config.asgi on gunicorn's ASGI workers (tests/security/test_slow_clients.py
    measures make run's command line; compose must not fall back to sync workers)."""

    def server(line: str) -> tuple[str, str]:
        args = shlex.split(line)
        app = next(arg for arg in args if arg.startswith("config."))
        return app, args[args.index("--worker-class") + 1]

    expected = server(web_command("127.0.0.1", 8000, workers=2))
    assert expected == ("config.asgi:application", "asgi")
    assert server(command_line(compose["services"]["web"])) == expected
    assert "--conf=/app/flowerconfig.py" in command_line(compose["services"]["flower"])
