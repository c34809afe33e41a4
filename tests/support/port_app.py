"""A small web app run inside a real instance (the CPU image) on the port a test exposes, and the fixture
that starts it.

The app (tornado, which the image's JupyterLab already brings) answers:
- GET /                 a line of text;
- GET /headers          the Cookie and Authorization headers it received, as JSON;
- GET /stream?id=<x>    server-sent events: "data: first", then waits until POST /release?id=<x>
                        arrives, then "data: last" (so a test can tell a streamed chunk from a buffered
                        answer without timing anything);
- POST /release?id=<x>  releases that stream;
- websocket /ws         echoes every message.
"""

import io
import secrets
import tarfile
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest

from tests.support.docker_instances import docker_client, remove_portal_objects

APP_PORT = 8000

APP = r"""
import asyncio, json, sys
import tornado.web, tornado.websocket

streams = {}

def released(name):
    return streams.setdefault(name, asyncio.Event())

class Root(tornado.web.RequestHandler):
    def get(self):
        self.write("hello from port %d\n" % PORT)

class Headers(tornado.web.RequestHandler):
    def get(self):
        self.write({
            "cookie": self.request.headers.get_list("Cookie"),
            "authorization": self.request.headers.get("Authorization"),
        })

class Stream(tornado.web.RequestHandler):
    async def get(self):
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.write("data: first\n\n")
        await self.flush()
        await released(self.get_argument("id")).wait()
        self.write("data: last\n\n")

class Release(tornado.web.RequestHandler):
    def post(self):
        released(self.get_argument("id")).set()
        self.write("released\n")

class Echo(tornado.websocket.WebSocketHandler):
    def check_origin(self, origin):
        return True

    def on_message(self, message):
        self.write_message(message, binary=isinstance(message, bytes))

async def main():
    app = tornado.web.Application(
        [(r"/", Root), (r"/headers", Headers), (r"/stream", Stream), (r"/release", Release), (r"/ws", Echo)]
    )
    app.listen(PORT, address="0.0.0.0")
    await asyncio.Event().wait()

PORT = int(sys.argv[1])
asyncio.run(main())
"""


@dataclass(frozen=True)
class InstanceContainer:
    """A running CPU-image container, as the Docker driver starts one, with the app on APP_PORT."""

    instance_id: uuid.UUID
    token: str
    # JupyterLab as the driver reports it, and the container's address on its own network.
    endpoint: str
    address: str
    container_name: str

    @property
    def app_url(self) -> str:
        """The app, reached directly (not through the gateway)."""
        return f"http://{self.address}:{APP_PORT}"

    def release(self, stream_id: str) -> None:
        httpx.post(f"{self.app_url}/release", params={"id": stream_id}, timeout=10).raise_for_status()


def _archive(name: str, text: str) -> bytes:
    data = text.encode()
    member = tarfile.TarInfo(name)
    member.size, member.mode, member.uid, member.gid = len(data), 0o644, 1000, 1000
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def start_instance_container(image: str, portal_id: str) -> InstanceContainer:
    """Starts the image as the Docker driver would (its own network, uid 1000, the lab's port published on
    loopback) and the app inside it; returns once the app answers."""
    client = docker_client()
    labels = {"devcloud.managed": "true", "devcloud.portal": portal_id}
    instance_id = uuid.uuid4()
    token = secrets.token_hex(24)
    network = client.networks.create(f"devcloud-net-{instance_id}", driver="bridge", labels=labels)
    container = client.containers.run(
        image,
        name=f"devcloud-{instance_id}",
        detach=True,
        labels=labels,
        network=network.name,
        user="1000:1000",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges:true"],
        environment={"JUPYTER_TOKEN": token, "JUPYTER_BASE_URL": f"/instances/{instance_id}/lab/"},
        ports={"8888/tcp": ("127.0.0.1", None)},
    )
    container.reload()
    address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
    lab_port = container.attrs["NetworkSettings"]["Ports"]["8888/tcp"][0]["HostPort"]
    container.put_archive("/tmp", _archive("port_app.py", APP))
    container.exec_run(
        ["/opt/venv/bin/python", "/tmp/port_app.py", str(APP_PORT)], detach=True, user="1000:1000"
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://{address}:{APP_PORT}/", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the app in {container.name} did not answer: {container.logs()[-2000:]!r}")
        time.sleep(0.2)
    return InstanceContainer(
        instance_id=instance_id,
        token=token,
        endpoint=f"http://127.0.0.1:{lab_port}",
        address=address,
        container_name=container.name,
    )


@pytest.fixture(scope="module", name="instance_container")
def instance_container_fixture(cpu_image):
    """One instance container for a test module; its rows are made per test (tests flush the database)."""
    portal_id = f"test-ports-{uuid.uuid4().hex[:10]}"
    try:
        yield start_instance_container(cpu_image, portal_id)
    finally:
        remove_portal_objects(portal_id)
