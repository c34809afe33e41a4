"""The docker driver gives a container only its own GPUs, hardens it, and fences its network.

Runs on the real Docker engine with the real CPU image, on a simulated 8x MI300X host whose /dev is a
directory of stand-in device nodes (kfd_dev_root).
"""

import socket

import pytest

from provisioning.drivers import driver_for
from provisioning.drivers.docker import container_name, network_name
from provisioning.workspaces import workspace_name
from tests.support.docker_instances import (
    docker_client,
    docker_portal_fixture,  # noqa: F401
    exec_in,
    make_host,
    make_image,
    make_instance,
    tcp_probe,
    wait_for_jupyter,
)
from tests.support.drivers import start_on
from tests.support.images import cpu_image_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture
def host(db, kfd_dev_root):
    return make_host("gpu-sim-01", kfd_dev_root.path, kfd_dev_root.render_minors)


@pytest.fixture
def image(db, cpu_image):
    return make_image(cpu_image)


def gpus_by_minor(host, *minors):
    return list(host.gpus.filter(render_minor__in=minors))


def test_it_gives_a_1x_container_only_the_render_node_of_its_gpu(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host)
    start_on(driver_for(host, "docker"), instance, gpus_by_minor(host, 136))

    _, listing = exec_in(container_name(instance.id), "ls", "/dev/dri")
    assert listing.split() == ["renderD136"]
    code, _ = exec_in(container_name(instance.id), "test", "-c", "/dev/kfd")
    assert code == 0, "/dev/kfd is missing"


def test_it_gives_an_8x_container_all_eight_render_nodes(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host, size="8x")
    start_on(driver_for(host, "docker"), instance, list(host.gpus.all()))

    _, listing = exec_in(container_name(instance.id), "ls", "/dev/dri")
    assert sorted(listing.split()) == sorted(
        f"renderD{minor}" for minor in (128, 136, 144, 152, 160, 168, 176, 184)
    )
    code, _ = exec_in(container_name(instance.id), "test", "-c", "/dev/kfd")
    assert code == 0


def test_it_lets_the_non_root_developer_open_its_gpu_through_the_render_group(
    docker_portal,
    alice,
    host,
    image,
    kfd_dev_root,
):
    # The stand-in nodes are 0660 root:render, like real ones: only the added group opens them.
    instance = make_instance(alice, image, host)
    start_on(driver_for(host, "docker"), instance, gpus_by_minor(host, 144))

    _, uid = exec_in(container_name(instance.id), "id", "-u")
    _, groups = exec_in(container_name(instance.id), "id", "-G")
    code, output = exec_in(
        container_name(instance.id), "python3", "-c", "open('/dev/dri/renderD144', 'rb').read(1)"
    )
    assert uid.strip() == "1000"
    assert str(kfd_dev_root.gid) in groups.split()
    assert code == 0, output


def test_it_hardens_the_container_as_docker_inspect_shows(docker_portal, alice, host, image, kfd_dev_root):
    instance = make_instance(alice, image, host)
    start_on(driver_for(host, "docker"), instance, gpus_by_minor(host, 136))

    attrs = docker_client().containers.get(container_name(instance.id)).attrs
    host_config = attrs["HostConfig"]
    assert host_config["Privileged"] is False
    assert host_config["CapDrop"] == ["ALL"]
    assert not host_config.get("CapAdd")
    assert host_config["SecurityOpt"] == ["no-new-privileges:true"]
    assert host_config["Memory"] == 512 * 1024 * 1024
    assert host_config["MemorySwap"] == 512 * 1024 * 1024
    assert host_config["NanoCpus"] == 250_000_000
    assert host_config["PidsLimit"] == 4096
    assert host_config["IpcMode"] == "private"
    assert host_config["NetworkMode"] == network_name(instance.id)
    assert list(attrs["NetworkSettings"]["Networks"]) == [network_name(instance.id)]
    assert host_config["GroupAdd"] == [str(kfd_dev_root.gid)]
    assert attrs["Config"]["User"] == "1000:1000"
    devices = {
        (d["PathOnHost"], d["PathInContainer"], d["CgroupPermissions"]) for d in host_config["Devices"]
    }
    assert devices == {
        (str(kfd_dev_root.kfd), "/dev/kfd", "rwm"),
        (str(kfd_dev_root.render_node(136)), "/dev/dri/renderD136", "rwm"),
    }
    # Exactly one mount: the user's workspace volume. No Docker socket, no host paths.
    assert [(m["Type"], m["Name"], m["Destination"]) for m in attrs["Mounts"]] == [
        ("volume", workspace_name(alice.id), "/workspace")
    ]
    assert not host_config.get("Binds")
    assert "docker.sock" not in str(attrs["Mounts"])
    assert host_config["PortBindings"]["8888/tcp"][0]["HostIp"] == "127.0.0.1"
    # (The image adds its own devcloud.image label.)
    assert (
        attrs["Config"]["Labels"].items()
        >= {
            "devcloud.managed": "true",
            "devcloud.portal": docker_portal,
            "devcloud.instance": str(instance.id),
            "devcloud.user": str(alice.id),
            "devcloud.gpus": "136",
        }.items()
    )


def test_it_keeps_the_container_away_from_the_hosts_postgres_and_redis(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host)
    start_on(driver_for(host, "docker"), instance, gpus_by_minor(host, 128))
    network = docker_client().networks.get(network_name(instance.id))
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]

    # Control: a service listening on every host address is reachable at the gateway, so the probe
    # below does reach the host and "closed" means the database and Redis are really out of reach.
    with socket.create_server(("0.0.0.0", 0)) as listener:
        control = tcp_probe(container_name(instance.id), gateway, listener.getsockname()[1])
    postgres = tcp_probe(container_name(instance.id), gateway, 5432)
    redis = tcp_probe(container_name(instance.id), gateway, 6379)

    assert control == "open"
    assert postgres.startswith("closed"), postgres
    assert redis.startswith("closed"), redis


def test_it_keeps_instances_from_reaching_each_other(docker_portal, alice, bob, host, image):
    driver = driver_for(host, "docker")
    alices = make_instance(alice, image, host)
    bobs = make_instance(bob, image, host)
    start_on(driver, alices, gpus_by_minor(host, 128))
    bobs_endpoint = start_on(driver, bobs, gpus_by_minor(host, 136)).endpoint
    wait_for_jupyter(bobs_endpoint, bobs)
    bobs_address = (
        docker_client()
        .containers.get(container_name(bobs.id))
        .attrs["NetworkSettings"]["Networks"][network_name(bobs.id)]["IPAddress"]
    )

    # Control: Bob's JupyterLab does answer on that address, from inside his own network.
    assert tcp_probe(container_name(bobs.id), bobs_address, 8888) == "open"
    assert tcp_probe(container_name(alices.id), bobs_address, 8888).startswith("closed")
