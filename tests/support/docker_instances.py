"""Helpers for tests that run instances on the real Docker engine.

The `docker_portal` fixture (import `docker_portal_fixture` to use it) gives the test a portal id of
its own (DEVCLOUD_PORTAL_ID), so that everything it makes carries the label devcloud.portal=<that id>,
and removes all of it afterwards: other test sessions sharing the engine are never touched, and nothing
leaks from one test into the next.
"""

import secrets
import time
import uuid

import docker
import httpx
import pytest

from portal.instances.models import Image, Instance
from provisioning.models import Gpu, GpuHost

LOCAL_ENGINE = "unix:///var/run/docker.sock"


def docker_client() -> docker.DockerClient:
    return docker.DockerClient(base_url=LOCAL_ENGINE, version="auto", timeout=60)


def remove_portal_objects(portal_id: str, client: docker.DockerClient | None = None) -> None:
    """Removes every container, network and volume labelled devcloud.portal=<portal_id> on the engine of
    `client` (this machine's by default)."""
    client = client or docker_client()
    label = {"label": f"devcloud.portal={portal_id}"}
    for container in client.containers.list(all=True, ignore_removed=True, filters=label):
        container.remove(force=True)
    for network in client.networks.list(filters=label):
        network.remove()
    for volume in client.volumes.list(filters=label):
        volume.remove(force=True)


@pytest.fixture(name="docker_portal")
def docker_portal_fixture(settings):
    """A portal id for this test alone; returns it, and removes what was made under it at teardown."""
    portal_id = f"test-drv-{uuid.uuid4().hex[:10]}"
    settings.DEVCLOUD_PORTAL_ID = portal_id
    yield portal_id
    remove_portal_objects(portal_id)


def make_host(name: str, dev_root, minors, *, docker_url: str = LOCAL_ENGINE) -> GpuHost:
    """A host whose /dev is `dev_root` (a stand-in), with one Gpu row per render minor.

    Small shares (a quarter CPU and 512 MB per GPU) so an 8x instance fits a two-core test machine.
    """
    host = GpuHost.objects.create(
        name=name, docker_url=docker_url, dev_root=str(dev_root), cpus_per_gpu=0.25, memory_mb_per_gpu=512
    )
    for index, minor in enumerate(minors):
        Gpu.objects.create(host=host, node_id=index + 1, gpu_id=40000 + index, render_minor=minor)
    return host


def make_image(reference: str, key: str = "cpu-drv") -> Image:
    image, _ = Image.objects.update_or_create(
        key=key,
        defaults={
            "name": "CPU JupyterLab",
            "sizes": ["1x", "8x"],
            "reference": reference,
            "needs_gpu": False,
        },
    )
    return image


def make_instance(user, image: Image, host: GpuHost, size: str = "1x", **fields) -> Instance:
    return Instance.objects.create(
        user=user,
        size=size,
        image=image,
        host=host,
        state=Instance.State.PROVISIONING,
        jupyter_token=secrets.token_hex(24),
        **fields,
    )


def status_url(endpoint: str, instance: Instance) -> str:
    return f"{endpoint}/instances/{instance.id}/lab/api/status"


def wait_for_jupyter(endpoint: str, instance: Instance, timeout: float = 90) -> dict:
    """Polls JupyterLab's /api/status with the token until it answers 200; returns its JSON.

    Raises AssertionError with the last answer when it does not within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(
                status_url(endpoint, instance),
                headers={"Authorization": f"token {instance.jupyter_token}"},
                timeout=5,
            )
            if response.status_code == 200:
                return response.json()
            last = f"HTTP {response.status_code}"
        except httpx.TransportError as error:
            last = repr(error)
        time.sleep(0.2)
    raise AssertionError(f"JupyterLab at {endpoint} did not answer within {timeout}s: {last}")


def exec_in(container_name: str, *command: str) -> tuple[int, str]:
    """`docker exec` in the container; returns (exit code, output)."""
    result = docker_client().containers.get(container_name).exec_run(list(command))
    return result.exit_code, result.output.decode(errors="replace")


# Prints "open" or the reason a TCP connection to argv[1]:argv[2] failed, within two seconds.
TCP_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
    print("open")
except OSError as error:
    print("closed", type(error).__name__, error)
"""


def tcp_probe(container_name: str, address: str, port: int) -> str:
    """Tries a TCP connection from inside the container; returns "open" or "closed <why>"."""
    _, output = exec_in(container_name, "python3", "-c", TCP_PROBE, address, str(port))
    return output.strip()
