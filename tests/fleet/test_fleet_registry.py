"""The fleet's registry serves images over TLS from the test CA; hosts pull from it through their engine."""

import http.client

import docker
import pytest

from tests.support.fleet import run_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


def test_it_pulls_the_cpu_image_onto_a_host_from_the_fleet_registry(fleet, fleet_cpu_image):
    host = fleet.hosts[0]
    local = docker.DockerClient(base_url="unix:///var/run/docker.sock", version="1.41")

    image = fleet.pull(host, fleet_cpu_image)

    assert image.id == local.images.get(fleet_cpu_image).id
    repository = fleet_cpu_image.rsplit(":", 1)[0]
    from_registry = f"{fleet.registry.address}/{repository}@sha256:"
    assert any(digest.startswith(from_registry) for digest in image.attrs["RepoDigests"])
    # Nothing is left tagged for the registry on this machine's own engine.
    local_tags = local.images.get(fleet_cpu_image).tags
    assert not [tag for tag in local_tags if tag.startswith(fleet.registry.address)]


def test_it_serves_the_registry_only_over_tls(fleet):
    status, body = fleet.registry.get("/v2/_catalog")
    address, port = fleet.registry.address.rsplit(":", 1)
    connection = http.client.HTTPConnection(address, int(port), timeout=5)
    connection.request("GET", "/v2/_catalog")
    plain = connection.getresponse()

    assert status == 200
    assert plain.status == 400
    assert b"repositories" not in plain.read()


def test_it_starts_a_new_host_with_an_empty_engine_that_pulls_from_the_registry(fleet, fleet_cpu_image):
    host = fleet.add_host()
    try:
        client = host.client()
        assert client.images.list() == []
        assert host.render_gid not in {other.render_gid for other in fleet.hosts if other is not host}

        fleet.pull(host, fleet_cpu_image)
        code, output = run_python(host, fleet_cpu_image, "import os; print(os.getuid())", user="1000:1000")

        assert (code, output.strip()) == (0, "1000")
    finally:
        fleet.remove_host(host)
