"""Test doubles for the callers of a driver: a fake backend that fails in set ways.

`FakeDriver` keeps its "containers" in one process-wide `cloud` (driver_for() builds a new driver per
call, as the real ones do, so the state cannot live on the driver). A real HTTP server on 127.0.0.1
plays JupyterLab: it answers `/instances/<id>/lab/api/status` for a running fake container when the
request carries that instance's token, so the readiness wait in provisioning is exercised for real.

Ways to fail, set with `cloud.behave(...)` and undone with `cloud.reset()`:
- engine_down: every call raises DriverError(permanent=False), like an unreachable Docker engine;
- transient_start_failures=n: the next n starts raise DriverError(permanent=False), then starts work;
- permanent_start_error="...": start raises DriverError(permanent=True) (a bad image, say);
- start_delay / ready_delay: start takes that long; JupyterLab answers that long after the start;
- never_ready: the container runs but JupyterLab answers 503 forever;
- crash_on_start: the container exits with code 1 right after starting.

Not for production: it isolates nothing and keeps nothing across processes.
"""

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .base import Driver, DriverError, InstanceRef, PollResult, StartResult, StartSpec

STATUS_PATH = re.compile(r"^/instances/(?P<instance_id>[0-9a-f-]{36})/lab/api/status/?$")


@dataclass
class Behaviour:
    engine_down: bool = False
    transient_start_failures: int = 0
    permanent_start_error: str = ""
    start_delay: float = 0.0
    ready_delay: float = 0.0
    never_ready: bool = False
    crash_on_start: bool = False


@dataclass
class FakeContainer:
    instance_id: str
    host_id: int
    token: str
    render_minors: list[int]
    started_at: float
    status: str = "running"
    exit_code: int | None = None


@dataclass
class FakeCloud:
    """Everything the fake backend holds, shared by every FakeDriver in the process."""

    behaviour: Behaviour = field(default_factory=Behaviour)
    containers: dict[str, FakeContainer] = field(default_factory=dict)
    # (method, instance id or host id) in call order, for tests that count retries.
    calls: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def reset(self) -> None:
        with self.lock:
            self.behaviour = Behaviour()
            self.containers.clear()
            self.calls.clear()

    def behave(self, **changes) -> Behaviour:
        with self.lock:
            for name, value in changes.items():
                if not hasattr(self.behaviour, name):
                    raise AttributeError(f"FakeDriver has no behaviour {name!r}")
                setattr(self.behaviour, name, value)
            return self.behaviour

    def count(self, method: str) -> int:
        return sum(1 for called, _ in self.calls if called == method)

    def add_container(
        self, *, host, instance_id: str, token: str = "", status: str = "running"
    ) -> FakeContainer:
        """A container the portal did not start this run (an orphan, or one a crashed worker left)."""
        with self.lock:
            container = FakeContainer(str(instance_id), host.pk, token, [], time.monotonic(), status)
            self.containers[str(instance_id)] = container
            return container

    def remove_container(self, instance_id) -> None:
        """Make a container vanish behind the portal's back (a host reboot, `docker rm -f`)."""
        with self.lock:
            self.containers.pop(str(instance_id), None)

    @property
    def endpoint(self) -> str:
        with self.lock:
            if self._server is None:
                self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
                self._server.daemon_threads = True
                threading.Thread(target=self._server.serve_forever, name="fake-jupyter", daemon=True).start()
            host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def status_answer(self, instance_id: str, authorization: str) -> int:
        """The HTTP status the fake JupyterLab answers for an instance's /api/status."""
        with self.lock:
            container = self.containers.get(instance_id)
            behaviour = self.behaviour
            if container is None or container.status != "running":
                return 502
            if authorization != f"token {container.token}":
                return 403
            if behaviour.never_ready or time.monotonic() < container.started_at + behaviour.ready_delay:
                return 503
            return 200


def _handler_for(cloud: FakeCloud):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            match = STATUS_PATH.match(self.path.split("?", 1)[0])
            status = (
                404
                if match is None
                else cloud.status_answer(match["instance_id"], self.headers.get("Authorization", ""))
            )
            body = json.dumps(
                {"started": "fake", "kernels": 0} if status == 200 else {"message": "no"}
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


cloud = FakeCloud()


class FakeDriver(Driver):
    """Keeps the Driver contract (idempotent start, stop that treats "gone" as done, poll safe anytime)."""

    name = "fake"
    isolates_gpus = False

    def _check_engine(self, method: str, subject) -> Behaviour:
        with cloud.lock:
            cloud.calls.append((method, str(subject)))
            behaviour = cloud.behaviour
        if behaviour.engine_down:
            raise DriverError(
                f"Cannot reach the Docker engine of {self.host}: connection refused.", permanent=False
            )
        return behaviour

    def start(self, spec: StartSpec, progress=None, turn=None) -> StartResult:
        if turn is not None:
            turn()
        behaviour = self._check_engine("start", spec.instance_id)
        with cloud.lock:
            if behaviour.transient_start_failures > 0:
                behaviour.transient_start_failures -= 1
                raise DriverError(f"The Docker engine of {self.host} timed out.", permanent=False)
        if behaviour.permanent_start_error:
            raise DriverError(behaviour.permanent_start_error, permanent=True)
        if behaviour.start_delay:
            time.sleep(behaviour.start_delay)
        endpoint = cloud.endpoint
        with cloud.lock:
            container = cloud.containers.get(str(spec.instance_id))
            if container is None:
                container = FakeContainer(
                    instance_id=str(spec.instance_id),
                    host_id=self.host.pk,
                    token=spec.jupyter_token,
                    render_minors=sorted(gpu.render_minor for gpu in spec.gpus),
                    started_at=time.monotonic(),
                )
                if behaviour.crash_on_start:
                    container.status, container.exit_code = "exited", 1
                cloud.containers[str(spec.instance_id)] = container
        return StartResult(endpoint=endpoint, state={"container": f"fake-{spec.instance_id}"})

    def stop(self, ref: InstanceRef) -> None:
        self._check_engine("stop", ref.id)
        cloud.remove_container(ref.id)

    def remove_workspace(self, owner_id) -> None:
        # The fake keeps no files; the call itself (in cloud.calls) is what tests look for.
        self._check_engine("remove_workspace", owner_id)

    def poll(self, ref: InstanceRef) -> PollResult:
        self._check_engine("poll", ref.id)
        with cloud.lock:
            container = cloud.containers.get(str(ref.id))
            if container is None or container.host_id != self.host.pk:
                return PollResult("missing")
            return PollResult(container.status, exit_code=container.exit_code)

    def managed_instance_ids(self) -> set[str]:
        self._check_engine("list", self.host.pk)
        with cloud.lock:
            return {c.instance_id for c in cloud.containers.values() if c.host_id == self.host.pk}


def make_host(name: str = "gpu-01", *, gpus: int = 8, state: str = "active"):
    """A GPU host with `gpus` MI300X-like GPUs, render minors 128, 136, 144, ... as on real hardware."""
    from provisioning.models import Gpu, GpuHost

    host = GpuHost.objects.create(name=name, state=state)
    Gpu.objects.bulk_create(
        Gpu(host=host, node_id=index + 1, gpu_id=1000 + index, render_minor=128 + 8 * index)
        for index in range(gpus)
    )
    return host


def make_image(key: str = "cpu", *, sizes=("1x", "8x"), enabled: bool = True, name: str = ""):
    """A catalogue image as `manage.py sync_images` would load it."""
    from portal.instances.models import Image

    return Image.objects.create(
        key=key,
        name=name or key.upper(),
        sizes=list(sizes),
        reference=f"devcloud/{key}:test",
        is_enabled=enabled,
        needs_gpu=False,
    )


def install() -> FakeCloud:
    """Make driver_for(host, "fake") find FakeDriver, and start from an empty cloud. Returns the cloud.

    Tests also set settings.DEVCLOUD_DRIVER = "fake", so launches (and the reconciler) use it.
    """
    from . import DRIVERS

    DRIVERS.setdefault("fake", "provisioning.drivers.fake.FakeDriver")
    cloud.reset()
    return cloud
