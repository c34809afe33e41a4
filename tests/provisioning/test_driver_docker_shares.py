"""The Docker driver applies the shares discovery gave each GPU: CPUs, memory and /dev/shm, as docker
inspect and the container itself show.

Runs on the real Docker engine with the real CPU image, on a simulated 8x MI300X host (kfd_dev_root) whose
stand-in sysfs says it has 2 CPUs and 16 GiB.
"""

import shutil

import pytest

from provisioning import services
from provisioning.drivers import driver_for
from provisioning.drivers.docker import container_name
from tests.support.docker_instances import (
    docker_client,
    docker_portal_fixture,  # noqa: F401
    exec_in,
    make_host,
    make_image,
    make_instance,
)
from tests.support.drivers import start_on
from tests.support.images import cpu_image_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

MIB = 1024 * 1024


@pytest.fixture
def host(db, tmp_path, kfd_dev_root, kfd_sysfs_8gpu):
    sysfs = tmp_path / "sysfs"
    shutil.copytree(kfd_sysfs_8gpu, sysfs)
    (sysfs / "proc").mkdir()
    (sysfs / "proc" / "meminfo").write_text(f"MemTotal:       {16 * 1024 * 1024} kB\n")
    (sysfs / "sys" / "devices" / "system" / "cpu").mkdir(parents=True)
    (sysfs / "sys" / "devices" / "system" / "cpu" / "online").write_text("0-1\n")
    host = make_host("gpu-sim-shares", kfd_dev_root.path, kfd_dev_root.render_minors)
    host.sysfs_root = str(sysfs)
    host.save(update_fields=["sysfs_root"])
    services.host_discover(host_id=host.pk)
    host.refresh_from_db()
    return host


def test_a_1x_container_gets_its_gpus_share_of_cpus_memory_and_shm(docker_portal, alice, host, cpu_image):
    # 16 GiB less the 8 GiB reserve floor, over 8 GPUs; 2 CPUs less a 1-CPU reserve is under the quarter-CPU
    # floor, which the host has.
    assert (host.cpus_per_gpu, host.memory_mb_per_gpu, host.shm_mb_per_gpu) == (0.25, 1024, 512)
    instance = make_instance(alice, make_image(cpu_image), host)
    start_on(driver_for(host, "docker"), instance, list(host.gpus.filter(render_minor=136)))

    host_config = docker_client().containers.get(container_name(instance.id)).attrs["HostConfig"]
    assert host_config["NanoCpus"] == 250_000_000
    assert host_config["Memory"] == 1024 * MIB
    assert host_config["ShmSize"] == 512 * MIB
    _, df = exec_in(container_name(instance.id), "df", "-m", "/dev/shm")
    assert df.splitlines()[-1].split()[1] == "512"
