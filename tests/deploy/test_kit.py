"""The deploy kit's files say what the code does: units run the layout of portal/workers.py, the
environment template documents every setting, the alert rules and the dashboard read metrics the portal
exports, and nginx accepts the site."""

import json
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from portal.workers import PROCESSES

from .kit import (
    DEPLOY,
    NGINX_SITE,
    REPO,
    UNITS,
    environment,
    exec_start,
    nginx_conf,
    nginx_site,
    self_signed,
    unit_sections,
)

SETTINGS = REPO / "portal" / "settings"
CELERY_UNITS = {
    "devcloud-worker.service": "default",
    "devcloud-provisioning.service": "provisioning",
    "devcloud-beat.service": "beat",
}
METRIC_SUFFIXES = re.compile(r"_(bucket|count|sum|total|created)$")


def test_it_runs_every_celery_process_of_the_layout_from_portal_workers():
    for unit, name in CELERY_UNITS.items():
        argv = exec_start(unit)
        assert argv[1:4] == ["-m", "portal.workers", name], unit
    assert set(CELERY_UNITS.values()) == set(PROCESSES), "a process of portal/workers.py has no unit"


def test_it_ships_exactly_one_beat():
    beats = [unit.name for unit in UNITS.glob("*.service") if "beat" in " ".join(exec_start(unit.name))]

    assert beats == ["devcloud-beat.service"]


def test_it_runs_several_uvicorn_workers_behind_nginx_on_loopback():
    argv = exec_start("devcloud-web.service")

    assert argv[1:4] == ["-m", "uvicorn", "portal.asgi:application"]
    assert int(argv[argv.index("--workers") + 1]) >= 2
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_it_runs_the_ssh_gateway():
    assert exec_start("devcloud-sshgateway.service")[1:3] == ["-m", "portal.sshgateway"]


def test_every_service_reads_the_one_environment_file_and_restarts():
    for unit in UNITS.glob("*.service"):
        service = unit_sections(unit.name)["Service"]
        assert service["EnvironmentFile"] == ["/etc/devcloud/devcloud.env"], unit.name
        assert service["Restart"] == ["always"], unit.name
        assert service["User"] == ["devcloud"], unit.name
        assert unit.name in unit_sections("devcloud.target")["Unit"]["Wants"][0].split(), unit.name


def test_only_the_workers_that_drive_engines_may_reach_the_docker_socket():
    # The docker group is root on the portal's machine: the internet-facing web process must not have it.
    def groups(unit):
        return " ".join(unit_sections(unit)["Service"].get("SupplementaryGroups", [])).split()

    with_docker = {unit.name for unit in UNITS.glob("*.service") if "docker" in groups(unit.name)}

    assert with_docker == {"devcloud-worker.service", "devcloud-provisioning.service"}
    web = unit_sections("devcloud-web.service")["Service"]
    assert web["User"] == ["devcloud"] and web["Group"] == ["devcloud"]
    hidden = " ".join(web.get("InaccessiblePaths", [])).split()
    assert {"-/run/docker.sock", "-/var/run/docker.sock"} <= set(hidden)


def settings_read_from_the_environment() -> set[str]:
    names = set()
    for module in SETTINGS.glob("*.py"):
        if module.name in ("test.py", "dev.py"):
            continue
        names |= set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z0-9_]+)"', module.read_text()))
    return names


def test_the_environment_template_documents_every_setting():
    text = (DEPLOY / "devcloud.env").read_text()
    documented = set(re.findall(r"^#?([A-Z][A-Z0-9_]+)=", text, re.MULTILINE))

    missing = settings_read_from_the_environment() - documented
    assert not missing, f"deploy/devcloud.env lacks {sorted(missing)}"
    for name in ("PROMETHEUS_MULTIPROC_DIR", "DEVCLOUD_PROVISIONING_CONCURRENCY", "DJANGO_SETTINGS_MODULE"):
        assert name in documented


def test_the_environment_template_passes_the_deploy_check_once_its_secrets_are_filled_in(tmp_path):
    env = {
        name: value.replace("CHANGE-ME", secrets.token_urlsafe(40)) if "CHANGE-ME" in value else value
        for name, value in environment().items()
    }
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    env["PATH"] = "/usr/bin:/bin"
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "metrics")

    result = subprocess.run(
        [
            str(Path(exec_start("devcloud-web.service")[0])),
            "manage.py",
            "check",
            "--deploy",
            "--fail-level",
            "WARNING",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def exported(db, settings, client):
    """Names of the metric families /metrics exports (without _total, _bucket... suffixes)."""
    settings.METRICS_TOKEN = "t"
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer t")
    names = set(re.findall(r"^# TYPE (\S+) ", response.content.decode(), re.MULTILINE))
    return {METRIC_SUFFIXES.sub("", name) for name in names}


def metrics_in(expression: str) -> set[str]:
    return {METRIC_SUFFIXES.sub("", name) for name in re.findall(r"\bdevcloud_[a-z0-9_]+", expression)}


def test_the_alert_rules_cover_what_an_operator_is_paged_for_with_exported_metrics(exported):
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    alerts = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}

    for needed in ("HostDown", "MeterTickLate", "LaunchQueueWait", "LaunchFailureRate", "EmailFailures", "GpuDrained"):
        assert f"DevCloud{needed}" in alerts
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("page", "ticket"), name
        assert rule["annotations"]["summary"], name
        assert metrics_in(rule["expr"]) <= exported, f"{name} reads metrics /metrics does not export"


def test_promtool_accepts_the_alert_rules():
    # scripts/test-services.sh installs it with Debian's prometheus package: this check always runs.
    assert shutil.which("promtool"), "promtool is not installed: run `make services` (Debian: prometheus)"
    result = subprocess.run(
        ["promtool", "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian: prometheus)")
def test_a_drained_gpu_raises_the_gpu_drained_alert_for_its_host():
    result = subprocess.run(
        ["promtool", "test", "rules", "gpu_drained_test.yml"],
        cwd=Path(__file__).parent / "promtool",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr


def test_the_grafana_dashboard_charts_exported_metrics(exported):
    dashboard = json.loads((DEPLOY / "grafana" / "devcloud-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]

    charted = set().union(*(metrics_in(expression) for expression in expressions))
    assert charted <= exported
    for figure in (
        "devcloud_gpus",
        "devcloud_instances",
        "devcloud_launch_queue_oldest_wait_seconds",
        "devcloud_launch_duration_seconds",
        "devcloud_launch_failures",
        "devcloud_periodic_task_duration_seconds",
        "devcloud_meter_lag_seconds",
        "devcloud_reconciler_repairs",
        "devcloud_credits_burned_gpu_hours",
        "devcloud_gateway_request_duration_seconds",
        "devcloud_gateway_open_websockets",
        "devcloud_email_send_failures",
        "devcloud_host_heartbeat_age_seconds",
    ):
        assert figure in charted, figure


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_nginx_accepts_the_site(tmp_path):
    cert, key = self_signed(tmp_path)
    site = nginx_site(https_port=8443, http_port=8080, portal_port=8000, cert=cert, key=key, secret="s")
    (tmp_path / "nginx.conf").write_text(nginx_conf(site, tmp_path))

    result = subprocess.run(
        ["nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert result.returncode == 0, result.stderr


def test_the_site_remembers_auth_answers_as_the_block_the_nginx_tests_run():
    # tests/gateway/test_nginx_subdomain.py runs the copy in docs/gateway.md in a real nginx.
    docs = (REPO / "docs" / "gateway.md").read_text()
    site = NGINX_SITE.read_text()
    for part in (r"^proxy_cache_path [^\n]*;$", r"^    location = /_devcloud_auth \{\n.*?^    \}$"):
        in_docs = re.findall(part, docs, re.MULTILINE | re.DOTALL)
        in_site = re.findall(part, site, re.MULTILINE | re.DOTALL)
        assert len(in_site) == 1 and "proxy_cache" in in_site[0], part
        assert in_docs == in_site, part
