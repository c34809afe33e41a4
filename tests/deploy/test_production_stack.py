"""The production smoke test: the deploy kit's own files, run for real, with a person going through nginx.

Production settings from deploy/devcloud.env; uvicorn with several workers and both Celery workers
started with the ExecStart lines of deploy/systemd/ (portal/workers.py's layout); nginx with
deploy/nginx/devcloud.conf and a self-signed certificate. Through nginx, over TLS, as a browser would:
sign up, confirm the emailed link (a local SMTP server receives it), launch the CPU image on the local
Docker engine, reach JupyterLab on the instance's own subdomain, and stop it. /readyz and /metrics are
read through the same nginx. The web process runs confined as its unit confines it under systemd
(InaccessiblePaths=: no Docker socket), so the journey proves that only the workers need the engine; so
does an operator's visit to a host's console page (its image list), "Check the Docker engine connection"
and "Discover GPUs", which the provisioning worker runs for the web.
"""

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlsplit

import docker
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from provisioning.models import GpuHost
from tests.browser.conftest import cpu_catalog, gpu_host  # noqa: F401  (fixtures)
from tests.conftest import PASSWORD as OPERATOR_PASSWORD
from tests.conftest import make_user
from tests.support.docker_instances import remove_portal_objects
from tests.support.forms import form_fields
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)
from tests.support.smtp import free_port, smtp_server
from tests.support.worker import _forget_queues, current_database_url, redis_url, unique_queue

from .kit import REPO, environment, exec_start, nginx_conf, nginx_site, self_signed, unit_sections

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("nginx") is None, reason="nginx is not installed (scripts/test-services.sh installs it)"
    ),
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(900, func_only=True),
]

OPS_REDIS_DB = int(os.environ.get("OPS_TEST_REDIS_DB", "13"))
PORTAL = "portal.example.com"
PASSWORD = "a long and unguessable passphrase 42"


class Process:
    """One service of the kit, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.popen.returncode}:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        """SIGTERM as systemd sends it, then SIGKILL the process group if it hangs."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)


def wait_for(predicate, *, timeout: float, what: str, processes=()):
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            process.check_alive()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"----- {p.name} -----\n{p.log()[-3000:]}" for p in processes)
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")
        time.sleep(0.3)


@dataclass
class Browser:
    """A browser behind nginx: one cookie jar per host, as a real one keeps them."""

    https_port: int
    jars: dict[str, dict[str, str]] = field(default_factory=dict)

    def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        parts = urlsplit(url)
        host = parts.hostname
        jar = self.jars.setdefault(host, {})
        headers = {"Host": host, **kwargs.pop("headers", {})}
        if jar:
            headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in jar.items())
        if method == "POST":
            headers.setdefault("Origin", f"https://{host}")
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        response = httpx.request(
            method,
            f"https://127.0.0.1:{self.https_port}{path}",
            headers=headers,
            verify=False,
            timeout=30,
            **kwargs,
        )
        for header in response.headers.get_list("set-cookie"):
            cookie = SimpleCookie()
            cookie.load(header)
            for name, morsel in cookie.items():
                if morsel["max-age"] in ("0", 0):
                    jar.pop(name, None)
                else:
                    jar[name] = morsel.value
        return response

    def get(self, url: str, **kwargs) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def follow(self, url: str, *, limit: int = 10) -> httpx.Response:
        """GET `url` and follow redirects across hosts (each with its own cookies)."""
        for _ in range(limit):
            response = self.get(url)
            if response.status_code not in (301, 302, 303):
                return response
            location = response.headers["location"]
            url = (
                location if location.startswith("https://") else f"https://{urlsplit(url).hostname}{location}"
            )
        raise AssertionError(f"more than {limit} redirects from {url}")

    def submit(self, page_url: str, page: httpx.Response, action: str, **values) -> httpx.Response:
        """POST the page's form (its hidden fields, CSRF token included) with `values`, as a person would."""
        fields = {name: found[0] for name, found in form_fields(page.text).items() if found}
        fields.update(values)
        target = action if action.startswith("https://") else f"https://{urlsplit(page_url).hostname}{action}"
        return self.request("POST", target, data=fields, headers={"Referer": page_url})


@pytest.fixture
def portal_id(settings):
    portal_id = f"test-deploy-{uuid.uuid4().hex[:10]}"
    settings.DEVCLOUD_PORTAL_ID = portal_id
    yield portal_id
    remove_portal_objects(portal_id)


@pytest.fixture
def stack(transactional_db, portal_id, cpu_catalog, gpu_host, tmp_path):  # noqa: F811
    """The kit's web, workers and nginx against the test database; yields (browser, mailbox, env)."""
    web_port, https_port, http_port = free_port(), free_port(), free_port()
    default_queue, provisioning_queue = unique_queue("deploy"), unique_queue("deploy-provisioning")
    broker = redis_url(OPS_REDIS_DB)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    gateway_secret = secrets.token_urlsafe(24)
    processes: list[Process] = []
    with smtp_server() as (mailbox, smtp_port):
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            **environment(),
            # What differs from a real machine: secrets, this test's database, Redis db and queues,
            # the local SMTP server, its own portal id on the engine, and temporary paths.
            "SECRET_KEY": secrets.token_urlsafe(50),
            "DATABASE_URL": current_database_url(),
            "REDIS_URL": broker,
            "CELERY_QUEUE": default_queue,
            "CELERY_PROVISIONING_QUEUE": provisioning_queue,
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(smtp_port),
            "EMAIL_HOST_USER": "",
            "EMAIL_HOST_PASSWORD": "",
            "EMAIL_USE_TLS": "false",
            "DEVCLOUD_PORTAL_ID": portal_id,
            # This machine's engine keeps its data on ext4, which cannot enforce disk limits.
            "DEVCLOUD_DISK_LIMITS": "warn",
            # JupyterLab starts slowly in a container on a busy two-core machine.
            "READY_TIMEOUT_SECONDS": "150",
            "GATEWAY_AUTH_SECRET": gateway_secret,
            "METRICS_TOKEN": "deploy-test-metrics-token",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "STATIC_ROOT": str(tmp_path / "static"),
            "SSH_GATEWAY_HOST_KEY": str(tmp_path / "ssh_host_key"),
            "PYTHONUNBUFFERED": "1",
        }
        # The README's install steps that the test database does not already have.
        for command in (["collectstatic", "--noinput", "-v", "0"], ["createcachetable"]):
            done = subprocess.run(
                [exec_start("devcloud-web.service")[0], "manage.py", *command],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr

        web = exec_start("devcloud-web.service")
        web[web.index("--port") + 1] = str(web_port)
        cert, key = self_signed(tmp_path)
        nginx_root = tmp_path / "nginx"
        nginx_root.mkdir()
        site = nginx_site(
            https_port=https_port,
            http_port=http_port,
            portal_port=web_port,
            cert=cert,
            key=key,
            secret=gateway_secret,
        )
        (nginx_root / "nginx.conf").write_text(nginx_conf(site, nginx_root))
        try:
            # The web unit as systemd confines it: no Docker socket (deploy/systemd/devcloud-web.service).
            processes.append(Process("web", as_unit_confines("devcloud-web.service", web, tmp_path), env, tmp_path))
            processes.append(Process("worker", exec_start("devcloud-worker.service"), env, tmp_path))
            processes.append(
                Process("provisioning", exec_start("devcloud-provisioning.service"), env, tmp_path)
            )
            processes.append(
                Process(
                    "nginx",
                    ["nginx", "-p", str(nginx_root), "-c", str(nginx_root / "nginx.conf")],
                    env,
                    tmp_path,
                )
            )
            browser = Browser(https_port)
            wait_for(
                lambda: _answers(browser, f"https://{PORTAL}/readyz"),
                timeout=90,
                what="/readyz through nginx",
                processes=processes,
            )
            for name in ("worker", "provisioning"):
                process = next(p for p in processes if p.name == name)
                wait_for(
                    lambda p=process: " ready." in p.log(),
                    timeout=90,
                    what=f"{name} ready",
                    processes=processes,
                )
            yield browser, mailbox, env, processes
        finally:
            for process in reversed(processes):
                process.stop()
            _forget_queues(broker, [default_queue, provisioning_queue])


# Runs the rest of its arguments with each path that exists covered by the first argument (an empty file,
# mode 000), in a mount namespace of its own: what systemd's InaccessiblePaths= does.
_COVER = (
    'cover=$1; shift; count=$1; shift; while [ "$count" -gt 0 ]; do '
    'if [ -e "$1" ]; then mount --bind "$cover" "$1" || exit 1; fi; shift; count=$((count - 1)); done; exec "$@"'
)


def as_unit_confines(unit: str, argv: list[str], tmp_path: Path) -> list[str]:
    """`argv` wrapped so that the unit's InaccessiblePaths= hold for it, as under systemd."""
    paths = [
        path.lstrip("-")
        for value in unit_sections(unit)["Service"].get("InaccessiblePaths", [])
        for path in value.split()
    ]
    cover = tmp_path / "inaccessible"
    cover.touch()
    cover.chmod(0)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _COVER, "sh", str(cover),
            str(len(paths)), *paths, *argv]  # fmt: skip


def engine_answers_inside(pid: int) -> bool:
    """Whether the Docker socket answers from inside the mount namespace of process `pid`."""
    try:
        client = docker.DockerClient(base_url=f"unix:///proc/{pid}/root/run/docker.sock", timeout=5)
        return client.ping()
    except docker.errors.DockerException:
        return False


def _answers(browser: Browser, url: str) -> bool:
    try:
        return browser.get(url).status_code == 200
    except httpx.TransportError:
        return False


def test_a_developer_signs_up_launches_jupyterlab_and_stops_through_the_production_stack(stack, cpu_image):
    browser, mailbox, env, processes = stack
    portal = f"https://{PORTAL}"

    # The stack runs the kit's worker layout: one worker per queue, launches on their own.
    ready = browser.get(f"{portal}/readyz")
    assert ready.json()["status"] == "ready"
    provisioning = next(process for process in processes if process.name == "provisioning")
    # The internet-facing web process cannot reach this machine's engine; the provisioning worker can,
    # and the whole journey below works that way.
    web = next(process for process in processes if process.name == "web")
    assert not engine_answers_inside(web.popen.pid)
    assert engine_answers_inside(provisioning.popen.pid)
    assert re.search(r"concurrency: \d+ \(thread\)", provisioning.log()), provisioning.log()[:2000]

    # Sign up.
    signup = browser.get(f"{portal}/accounts/signup/")
    assert signup.status_code == 200
    email = f"dev-{uuid.uuid4().hex[:8]}@example.com"
    response = browser.submit(
        f"{portal}/accounts/signup/",
        signup,
        "/accounts/signup/",
        email=email,
        password=PASSWORD,
        password_confirm=PASSWORD,
    )
    # The same answer whether or not the address has an account, and no session yet.
    assert response.status_code == 200 and "Check your email" in response.text, response.text[:2000]

    # Confirm the address: the link opens a page whose form takes the password and logs in.
    message = mailbox.wait_for(lambda m: email in m.rcpt_tos, timeout=60)
    link = next(link for link in message.links() if "/accounts/verify/" in link)
    assert link.startswith(f"{portal}/accounts/verify/")
    page = browser.get(link)
    assert page.status_code == 200
    confirmed = browser.submit(link, page, urlsplit(link).path, password=PASSWORD)
    assert confirmed.status_code == 302, confirmed.text[:2000]
    assert browser.jars[PORTAL].get("__Host-sessionid"), "production names the session cookie __Host-"

    # Launch the CPU image.
    instances = browser.get(f"{portal}/instances/")
    assert instances.status_code == 200
    launched = browser.submit(f"{portal}/instances/", instances, "/instances/launch/", size="1x", image="cpu")
    assert launched.status_code == 302, launched.text[:3000]
    detail = launched.headers["location"]
    instance_id = re.search(r"/instances/([0-9a-f-]{36})/", detail).group(1)

    def state():
        return browser.get(f"{portal}/instances/{instance_id}/status.json").json()

    status = wait_for(
        lambda: (s := state())["state"] in ("running", "failed") and s,
        timeout=240,
        what="the instance to start",
        processes=processes,
    )
    assert status["state"] == "running", status["failure_reason"]

    # Open JupyterLab: the ticket handshake between the portal and the lab's own subdomain, then the lab.
    lab = browser.follow(f"{portal}/instances/{instance_id}/open")
    lab_host = f"{instance_id}.lab.example.com"
    assert lab.status_code == 200, lab.text[:2000]
    api = browser.get(f"https://{lab_host}/instances/{instance_id}/lab/api/status")
    assert api.status_code == 200 and "started" in api.json()
    assert "__Host-devcloud_lab" in browser.jars[lab_host]
    assert not any(name.endswith("sessionid") for name in browser.jars[lab_host]), (
        "the portal session stays home"
    )

    # Its log comes through the API, read by a worker: the confined web process cannot reach the engine.
    logs = browser.get(f"{portal}/api/v1/instances/{instance_id}/logs?lines=50")
    assert logs.status_code == 200, logs.text[:2000]
    assert logs.json()["note"] == "" and any("Jupyter" in line for line in logs.json()["lines"]), logs.json()

    # Stop it.
    page = browser.get(f"{portal}/instances/{instance_id}/")
    stopped = browser.submit(f"{portal}/instances/{instance_id}/", page, f"/instances/{instance_id}/stop/")
    assert stopped.status_code == 302
    wait_for(
        lambda: state()["state"] == "stopped", timeout=120, what="the instance to stop", processes=processes
    )
    assert browser.get(f"https://{lab_host}/instances/{instance_id}/lab/api/status").status_code != 200

    # The launch was timed in the provisioning worker and is served by the web processes: the
    # multiprocess metrics add up across the stack. Without the token, nothing.
    assert browser.get(f"{portal}/metrics").status_code == 401
    scraped = browser.get(f"{portal}/metrics", headers={"Authorization": f"Bearer {env['METRICS_TOKEN']}"})
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
    }
    assert samples[("devcloud_launch_duration_seconds_count", (("phase", "total"),))] >= 1
    assert samples[("devcloud_instances", (("state", "stopped"),))] >= 1
    assert samples[("devcloud_celery_workers", (("queue", env["CELERY_PROVISIONING_QUEUE"]),))] == 1


def test_an_operator_reads_a_hosts_images_checks_its_engine_and_discovers_its_gpus_through_the_production_stack(
    stack, gpu_host  # noqa: F811
):
    browser, _, _, processes = stack
    portal = f"https://{PORTAL}"
    web = next(process for process in processes if process.name == "web")
    assert not engine_answers_inside(web.popen.pid)
    # Registration asked already; forget it, so the check below must ask again.
    GpuHost.objects.filter(pk=gpu_host.pk).update(can_limit_workspaces=None, engine_storage="")
    make_user("olivia@ops.example.com", staff=True)

    login = browser.get(f"{portal}/admin/login/?next=/admin/")
    assert login.status_code == 200, login.text[:2000]
    signed_in = browser.submit(
        f"{portal}/admin/login/", login, "/admin/login/?next=/admin/",
        username="olivia@ops.example.com", password=OPERATOR_PASSWORD,
    )  # fmt: skip
    assert signed_in.status_code == 302, signed_in.text[:2000]

    # The host page lists the catalogue's images as the provisioning worker read them from the engine.
    host_url = f"{portal}/admin/provisioning/gpuhost/{gpu_host.pk}/change/"
    page = browser.get(host_url)
    assert page.status_code == 200, page.text[:2000]
    assert 'data-testid="images-error"' not in page.text, page.text.split('data-testid="images-error"')[1][:500]
    assert re.search(r'<tr data-image="cpu">.*?present', page.text, re.DOTALL), page.text[:3000]

    # "Check the Docker engine connection" and "Discover GPUs" from the host list, as an operator ticks them.
    changelist = f"{portal}/admin/provisioning/gpuhost/"
    for action, said in (("check_engines", " answered."), ("discover_gpus", "8 GPU(s) present")):
        listing = browser.get(changelist)
        # Posted by hand: Browser.submit's own "action" argument is this form's field name.
        fields = {name: found[0] for name, found in form_fields(listing.text).items() if found}
        fields.update(action=action, index="0", _selected_action=str(gpu_host.pk))
        done = browser.request("POST", changelist, data=fields, headers={"Referer": changelist})
        assert done.status_code == 302, done.text[:3000]
        shown = browser.get(changelist).text
        messages = re.search(r'<ul class="messagelist">(.*?)</ul>', shown, re.DOTALL)
        assert messages and said in messages.group(1), (messages and messages.group(1)) or shown[:3000]
        assert "did not answer" not in messages.group(1)
    checked = GpuHost.objects.get(pk=gpu_host.pk)
    # This machine's engine keeps its data on ext4: the check says it cannot enforce the disk limits.
    assert checked.can_limit_workspaces is False and checked.engine_storage.startswith("overlay2")
    provisioning = next(process for process in processes if process.name == "provisioning")
    for task in ("console_host_images", "console_host_check", "console_host_discover"):
        assert f"provisioning.{task}" in provisioning.log(), provisioning.log()[-3000:]
