"""On the test fleet (GPU hosts reached only over mutual TLS, each with its own render gid): the portal
discovers each host's GPUs and device groups through its engine, a container as uid 1000 opens its
/dev/kfd and render node and sees no other, JupyterLab is published only on the host's private address
(where this machine, the gateway's, reaches it), and gpu_busy_percent is read on the host."""

import secrets
import uuid
from pathlib import Path

import pytest

from portal.instances.models import Image, Instance
from provisioning import hostfs, services
from provisioning.drivers import driver_for
from provisioning.drivers.docker import container_name
from tests.support.docker_instances import wait_for_jupyter
from tests.support.drivers import instance_ref, start_on

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600, func_only=True)]

OPEN_DEVICES = """
import os, sys
for path in sys.argv[1:]:
    os.close(os.open(path, os.O_RDWR))
print("opened;dri:" + ",".join(sorted(os.listdir("/dev/dri"))))
"""


@pytest.fixture(scope="module")
def image_on_hosts(fleet, fleet_cpu_image):
    for host in fleet.hosts:
        fleet.pull(host, fleet_cpu_image)
    return fleet_cpu_image


@pytest.fixture
def registered(db, fleet, image_on_hosts, settings):
    """Every fleet host registered as an operator would: engine checked over TLS, GPUs discovered."""
    settings.DEVCLOUD_PORTAL_ID = f"test-fleet-{uuid.uuid4().hex[:8]}"
    hosts = []
    for fleet_host in fleet.hosts:
        host = services.host_register(
            name=fleet_host.name,
            docker_url=fleet_host.docker_url,
            private_address=fleet_host.private_address,
            tls_ca_cert=fleet_host.tls_ca_cert,
            tls_client_cert=fleet_host.tls_client_cert,
            tls_client_key=fleet_host.tls_client_key,
            sysfs_root=fleet_host.sysfs_root,
            dev_root=fleet_host.dev_root,
        )
        host.cpus_per_gpu, host.memory_mb_per_gpu = 0.25, 512
        host.save(update_fields=["cpus_per_gpu", "memory_mb_per_gpu"])
        hosts.append((fleet_host, host))
    return hosts


@pytest.fixture
def launched(alice, registered, image_on_hosts):
    """Factory: launch(host, minor) starts an instance of alice's on that host with that GPU."""
    image, _ = Image.objects.update_or_create(
        key="cpu-fleet",
        defaults={"name": "CPU JupyterLab", "sizes": ["1x", "8x"], "reference": image_on_hosts, "needs_gpu": False},
    )
    started = []

    def launch(host, minor=None):
        """One GPU (render minor `minor`), or every GPU of the host (an 8x) when minor is None."""
        gpus = list(host.gpus.order_by("node_id")) if minor is None else [host.gpus.get(render_minor=minor)]
        instance = Instance.objects.create(
            user=alice,
            size="1x" if minor is not None else "8x",
            image=image,
            host=host,
            state=Instance.State.PROVISIONING,
            jupyter_token=secrets.token_hex(24),
        )
        driver = driver_for(host, "docker")
        started.append((driver, instance))
        return instance, start_on(driver, instance, gpus)

    yield launch
    for driver, instance in started:
        driver.stop(instance_ref(instance))
        driver.remove_workspace(instance.user_id)


def exec_on(fleet_host, instance, *command):
    client = fleet_host.client()
    try:
        result = client.containers.get(container_name(instance.id)).exec_run(list(command))
        return result.exit_code, result.output.decode(errors="replace")
    finally:
        client.close()


def test_it_discovers_each_hosts_gpus_and_its_own_render_gid_through_its_engine(registered):
    for fleet_host, host in registered:
        gpus = list(host.gpus.order_by("node_id"))
        assert [gpu.render_minor for gpu in gpus] == fleet_host.render_minors
        assert {gpu.render_gid for gpu in gpus} == {fleet_host.render_gid}
        assert host.kfd_gid == fleet_host.render_gid
    assert len({host.kfd_gid for _, host in registered}) == len(registered)


def test_it_lets_uid_1000_open_its_kfd_and_render_node_on_each_host_and_no_other(launched, registered):
    for fleet_host, host in registered:
        instance, _ = launched(host, 160)

        code, output = exec_on(fleet_host, instance, "python3", "-c", OPEN_DEVICES, "/dev/kfd", "/dev/dri/renderD160")

        assert code == 0, output
        assert "opened;dri:renderD160" in output
        _, uid = exec_on(fleet_host, instance, "id", "-u")
        assert uid.strip() == "1000"


def test_an_8x_on_one_host_opens_its_kfd_and_all_eight_render_nodes_as_uid_1000(launched, registered):
    fleet_host, host = registered[-1]
    instance, _ = launched(host)
    nodes = [f"/dev/dri/renderD{minor}" for minor in fleet_host.render_minors]

    code, output = exec_on(fleet_host, instance, "python3", "-c", OPEN_DEVICES, "/dev/kfd", *nodes)

    assert code == 0, output
    expected = ",".join(sorted(f"renderD{minor}" for minor in fleet_host.render_minors))
    assert f"opened;dri:{expected}" in output


def test_it_publishes_jupyterlab_only_on_each_hosts_private_address(launched, registered):
    for fleet_host, host in registered:
        instance, result = launched(host, 128)

        client = fleet_host.client()
        try:
            attrs = client.containers.get(container_name(instance.id)).attrs
        finally:
            client.close()
        bindings = [b for ports in attrs["NetworkSettings"]["Ports"].values() if ports for b in ports]
        assert bindings and {b["HostIp"] for b in bindings} == {fleet_host.private_address}
        assert result.endpoint == f"http://{fleet_host.private_address}:{result.state['host_port']}"
        # The gateway (this machine) reaches it there.
        wait_for_jupyter(result.endpoint, instance)


def test_it_reads_gpu_busy_percent_on_each_host_through_its_engine(registered):
    for index, (fleet_host, host) in enumerate(registered):
        busy = Path(fleet_host.sysfs_root) / "sys/class/drm/renderD144/device/gpu_busy_percent"
        busy.parent.mkdir(parents=True, exist_ok=True)
        busy.write_text(f"{40 + index}\n")
        try:
            assert hostfs.gpu_busy(host, [144]) == {144: 40 + index}
        finally:
            busy.unlink()
