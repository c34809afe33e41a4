"""Helpers for the end-to-end tests: GPU hosts on the real engine, waiting on real state, running code in
a kernel through the gateway, and the infrastructure a test can take away (a Docker engine behind a TCP
forwarder, a throwaway Redis)."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime

import httpx
from django.db.models import Sum
from django.utils import timezone

from portal.credits.models import LedgerEntry
from portal.instances.models import Instance
from provisioning import services as hosts
from provisioning.drivers.docker import container_name
from provisioning.models import GpuAllocation, GpuHost
from tests.conftest import KFD_FIXTURES, make_kfd_dev_root
from tests.gateway.helpers import browser, free_port, lab_url, ws_connect
from tests.support.docker_instances import LOCAL_ENGINE, docker_client

KFD_8GPU = KFD_FIXTURES / "mi300x-8gpu"
DOCKER_SOCKET = "/var/run/docker.sock"


def stand_in_dev_root(path):
    """A stand-in /dev for the 8-GPU fixture host (dev/kfd, dev/dri/renderD128..184). Needs root."""
    from provisioning.inventory import read_inventory

    return make_kfd_dev_root(path, [gpu.drm_render_minor for gpu in read_inventory(KFD_8GPU)])


def register_host(name: str, dev_root, *, docker_url: str = LOCAL_ENGINE) -> GpuHost:
    """Registers a host as an operator does (engine checked, GPUs discovered from the 8-GPU fixture sysfs)."""
    return hosts.host_register(
        name=name, docker_url=docker_url, sysfs_root=str(KFD_8GPU), dev_root=str(dev_root)
    )


def wait_for(predicate, *, timeout: float, what: str, interval: float = 0.05):
    """Calls `predicate` until it returns something truthy, and returns that. Raises AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def wait_until_ready_for(instance: Instance, seconds: float) -> None:
    """Waits until the instance has been ready for `seconds` (so a meter tick has whole seconds to charge)."""
    wait_for(
        lambda: (timezone.now() - instance.ready_at).total_seconds() > seconds,
        timeout=seconds + 5,
        what=f"{seconds} s of ready time",
    )


def wait_for_gpus_released(instance_id, timeout: float = 15) -> None:
    """A failed launch is marked failed before its GPUs go back (after the container's removal is tried)."""
    wait_for(lambda: not live_minors(instance_id), timeout=timeout, what="the GPUs to be released")


def state_of(instance_id) -> Instance:
    return Instance.objects.get(pk=instance_id)


def wait_for_state(instance_id, *states, timeout: float = 90) -> Instance:
    """Waits for the instance to reach one of `states` (read from the database); returns it."""

    def reached():
        instance = state_of(instance_id)
        return instance if instance.state in states else None

    try:
        return wait_for(reached, timeout=timeout, what=f"instance to be {'/'.join(states)}")
    except AssertionError as error:
        instance = state_of(instance_id)
        events = [event.message for event in instance.events.order_by("created_at")]
        raise AssertionError(f"{error}; it is {instance.state}/{instance.step}; events: {events}") from None


def containers_of(instance_id) -> list:
    """The instance's containers on the engine, running or not (by exact name). One that goes between
    the engine's list and its inspection (a start tried again) is not counted."""
    name = container_name(instance_id)
    return [
        c
        for c in docker_client().containers.list(all=True, ignore_removed=True, filters={"name": name})
        if c.name == name
    ]


def live_minors(instance_id) -> list[int]:
    return sorted(
        GpuAllocation.objects.filter(instance_id=instance_id, released_at__isnull=True).values_list(
            "gpu__render_minor", flat=True
        )
    )


def usage_charged(instance_id) -> int:
    """GPU-seconds the ledger charged for the instance (usage entries, as a positive number)."""
    total = LedgerEntry.objects.filter(
        kind=LedgerEntry.Kind.USAGE, idempotency_key__startswith=f"usage:{instance_id}:"
    ).aggregate(total=Sum("gpu_seconds"))["total"]
    return -(total or 0)


def assert_consistent(instance_id) -> None:
    """Exactly one container or none for the instance, and its GPUs match: a live instance's container has
    exactly the GPUs the database gives it; an ended one has neither container nor GPUs."""
    instance = state_of(instance_id)
    if instance.state == Instance.State.FAILED:
        wait_for_gpus_released(instance_id)
    containers = containers_of(instance_id)
    assert len(containers) <= 1, [c.name for c in containers]
    if instance.state in (Instance.State.STOPPED, Instance.State.FAILED):
        assert containers == [], f"{instance.state} instance still has a container"
        assert live_minors(instance_id) == [], f"{instance.state} instance still holds GPUs"
        return
    if containers:
        labelled = containers[0].labels["devcloud.gpus"]
        assert labelled == ",".join(str(minor) for minor in live_minors(instance_id))


# --- JupyterLab through the gateway -----------------------------------------------------------------------


def execute_request(code: str) -> dict:
    return {
        "header": {
            "msg_id": uuid.uuid4().hex,
            "username": "e2e",
            "session": uuid.uuid4().hex,
            "msg_type": "execute_request",
            "version": "5.3",
            "date": datetime.now(UTC).isoformat(),
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        "channel": "shell",
        "buffers": [],
    }


def run_in_kernel(server, session_key: str, instance_id, *cells: str) -> list[str]:
    """Starts a kernel through the gateway, runs each cell over the websocket, and returns each cell's
    stdout (errors included as "ERROR <ename>: <evalue>"). The kernel is shut down afterwards."""
    with browser(server, session_key) as lab:
        created = lab.post(lab_url(instance_id, "api/kernels"), json={"name": "python3"})
        assert created.status_code == 201, created.text
        kernel_id = created.json()["id"]
        ws = ws_connect(server, lab_url(instance_id, f"api/kernels/{kernel_id}/channels"), session_key)
        try:
            return [_execute(ws, cell) for cell in cells]
        finally:
            ws.close()
            lab.delete(lab_url(instance_id, f"api/kernels/{kernel_id}"))


def _execute(ws, code: str) -> str:
    request = execute_request(code)
    ws.send(json.dumps(request))
    output = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        message = json.loads(ws.recv())
        if message.get("parent_header", {}).get("msg_id") != request["header"]["msg_id"]:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            output += content["text"]
        elif kind == "error":
            output += f"ERROR {content['ename']}: {content['evalue']}"
        elif kind == "status" and content["execution_state"] == "idle":
            return output
    raise AssertionError(f"the kernel never finished {code!r}")


def gateway_status(server, session_key: str, instance_id) -> httpx.Response:
    with browser(server, session_key) as lab:
        return lab.get(lab_url(instance_id, "api/status"))


# --- Infrastructure a test can take away -------------------------------------------------------------------


class EngineProxy:
    """A forwarder on a unix socket of its own to the local Docker socket: a Docker engine the test can stop.

    A unix socket, not a TCP port: the portal refuses an engine on plain TCP (anyone who reaches it owns
    the host). `kill()` closes the listener and every open connection, as a dead dockerd would (refused
    from then on); `start()` brings it back at the same path. The machine's real dockerd is never touched.
    """

    def __init__(self, target: str = DOCKER_SOCKET):
        self.target = target
        self.path = os.path.join(tempfile.mkdtemp(prefix="devcloud-engine-proxy-"), "docker.sock")
        self._listener = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def start(self) -> "EngineProxy":
        if os.path.exists(self.path):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(64)
        listener.settimeout(0.1)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener):
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                engine.connect(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, engine))
            for source, sink in ((client, engine), (engine, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def kill(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class ThrowawayRedis:
    """A redis-server of the test's own on a free loopback port, without persistence: a restart loses
    every queued message, the worst case for a broker restart."""

    def __init__(self):
        self.port = free_port()
        self.process = None
        self.binary = shutil.which("redis-server") or "/usr/bin/redis-server"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "ThrowawayRedis":
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answering():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    return sock.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        wait_for(answering, timeout=10, what="redis-server to answer")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


def worker_env(portal_id: str, **extra) -> dict[str, str]:
    """Environment of an e2e worker: this test's portal id (so it only ever touches its own containers)."""
    return {
        "DEVCLOUD_PORTAL_ID": portal_id,
        "DEVCLOUD_DRIVER": "docker",
        "READY_TIMEOUT_SECONDS": "90",
        "LOG_LEVEL": "INFO",
        **{key: str(value) for key, value in extra.items()},
    }


def is_root() -> bool:
    return os.geteuid() == 0
