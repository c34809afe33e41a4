"""Containers on a fleet host publish on the host's private address, and cannot reach the host's engine
nor the portal machine's PostgreSQL and Redis."""

import socket
import time
import urllib.request
import uuid

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

TCP_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("open")
except OSError as error:
    print("closed", type(error).__name__, error)
"""


@pytest.fixture
def container(fleet, image):
    """Factory: container(host, *command, ports=...) starts one as uid 1000 on an instance-like bridge
    (named dc-<hex>, as the docker driver names them) and removes it and its network afterwards."""
    made = []

    def start(host, *command, ports=None):
        client = host.client()
        suffix = uuid.uuid4().hex[:12]
        network = client.networks.create(
            f"fleet-test-{suffix}",
            driver="bridge",
            options={"com.docker.network.bridge.name": f"dc-{suffix}"},
        )
        box = client.containers.run(
            image,
            entrypoint=["/usr/bin/tini", "--", *command],
            user="1000:1000",
            network=network.name,
            ports=ports or {},
            detach=True,
        )
        made.append((client, box, network))
        return box

    yield start
    for client, box, network in made:
        box.remove(force=True)
        network.remove()
        client.close()


def published_port(box, port: str) -> tuple[str, int]:
    box.reload()
    binding = box.attrs["NetworkSettings"]["Ports"][port][0]
    return binding["HostIp"], int(binding["HostPort"])


def get(url: str, *, within: float) -> tuple[int, bytes]:
    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                return response.status, response.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def probe(box, address: str, port: int) -> str:
    code, output = box.exec_run(["python3", "-c", TCP_PROBE, address, str(port)], user="1000:1000")
    return output.decode().strip()


@pytest.mark.parametrize("index", [0, 1], ids=["host-1", "host-2"])
def test_it_answers_a_port_published_on_the_hosts_private_address(fleet, container, index):
    host = fleet.hosts[index]
    server = ("python3", "-m", "http.server", "8000", "--directory", "/etc")
    box = container(host, *server, ports={"8000/tcp": (host.private_address, None)})

    address, port = published_port(box, "8000/tcp")
    status, body = get(f"http://{address}:{port}/hostname", within=30)

    assert address == host.private_address
    assert status == 200
    assert body.strip() == box.attrs["Config"]["Hostname"].encode()


def test_it_keeps_containers_away_from_the_engine_port_and_the_portals_postgres_and_redis(fleet, container):
    host = fleet.hosts[1]
    box = container(host, "sleep", "600")

    # Control: the container does reach this machine (the host's gateway) and the outside of the host:
    # a service listening on every address of this machine answers, so "closed" below means the port
    # is out of reach, not that the container has no network.
    with socket.create_server(("0.0.0.0", 0)) as listener:
        control = probe(box, host.gateway_address, listener.getsockname()[1])
    results = {
        "engine": probe(box, host.private_address, 2376),
        "postgres at the gateway": probe(box, host.gateway_address, 5432),
        "redis at the gateway": probe(box, host.gateway_address, 6379),
        "postgres on loopback": probe(box, "127.0.0.1", 5432),
        "redis on loopback": probe(box, "127.0.0.1", 6379),
    }

    assert control == "open"
    assert all(result.startswith("closed") for result in results.values()), results
