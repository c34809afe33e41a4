"""A GPU host reached only through its engine over mutual TLS: discovery, device groups, published ports and
GPU telemetry all go through that engine.

The engine is this machine's real dockerd behind a mutual-TLS port (host_engine_mtls), so the portal
treats it as remote: nothing is read from the worker's own filesystem. The host's files are a stand-in
tree: the 8x MI300X KFD fixture under <root>/sys, and device nodes under <root>/dev owned by non-root
groups that are not this machine's render group (KFD_GID for /dev/kfd, RENDER_GID for the render nodes),
mode 0660, as on a real host.
"""

import os
import shutil
import stat

import pytest

from provisioning import hostfs, services
from provisioning.drivers import driver_for
from provisioning.drivers.docker import container_name
from provisioning.inventory import InventoryError, read_inventory
from provisioning.models import GpuHost
from tests.conftest import KFD_FIXTURES, MI300X_RENDER_MINORS, make_kfd_dev_root
from tests.support.docker_instances import (
    docker_client,
    docker_portal_fixture,  # noqa: F401
    exec_in,
    make_image,
    make_instance,
    wait_for_jupyter,
)
from tests.support.drivers import start_on
from tests.support.images import cpu_image_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

KFD_GID = 23457
RENDER_GID = 23456
OPEN_DEVICES = "import sys\nfor path in sys.argv[1:]:\n    open(path, 'rb').close()\nprint('opened')"


def busy_file(root, minor):
    return root / "sys" / "class" / "drm" / f"renderD{minor}" / "device" / "gpu_busy_percent"


def set_gpu_busy(root, minor, percent):
    path = busy_file(root, minor)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{percent}\n")


@pytest.fixture
def host_root(tmp_path):
    """The host's / as its engine sees it: sys/ (KFD topology, gpu_busy_percent at 0) and dev/."""
    if os.geteuid() != 0:
        pytest.skip("creating device nodes (mknod) needs root")
    root = tmp_path / "gpu-host"
    shutil.copytree(KFD_FIXTURES / "mi300x-8gpu" / "sys", root / "sys")
    for minor in MI300X_RENDER_MINORS:
        set_gpu_busy(root, minor, 0)
    dev = make_kfd_dev_root(root, MI300X_RENDER_MINORS, gid=RENDER_GID)
    os.chown(dev.kfd, 0, KFD_GID)
    return root


@pytest.fixture
def remote_host(db, docker_portal, cpu_image, host_engine_mtls, host_root):
    host = services.host_register(
        name="gpu-remote",
        private_address="127.0.0.1",
        sysfs_root=str(host_root),
        dev_root=str(host_root),
        **host_engine_mtls,
    )
    host.cpus_per_gpu, host.memory_mb_per_gpu = 0.25, 512
    host.save(update_fields=["cpus_per_gpu", "memory_mb_per_gpu"])
    return host


def helper_containers(portal_id):
    return docker_client().containers.list(
        all=True,
        ignore_removed=True,
        filters={"label": ["devcloud.helper=hostfs", f"devcloud.portal={portal_id}"]},
    )


def launch(user, host, cpu_image, minor):
    instance = make_instance(user, make_image(cpu_image), host)
    gpu = host.gpus.get(render_minor=minor)
    result = start_on(driver_for(host, "docker"), instance, [gpu])
    return instance, gpu, result


def test_it_discovers_a_remote_hosts_gpus_and_device_groups_through_its_engine(remote_host, docker_portal):
    gpus = list(remote_host.gpus.order_by("node_id"))

    assert [gpu.render_minor for gpu in gpus] == MI300X_RENDER_MINORS
    assert {gpu.render_gid for gpu in gpus} == {RENDER_GID}
    assert remote_host.kfd_gid == KFD_GID
    assert {gpu.vram_bytes for gpu in gpus} == {206141652992}
    # The helper is gone once it has answered.
    assert helper_containers(docker_portal) == []


def test_it_reads_the_same_through_a_helper_container_as_on_the_host_itself(
    db, docker_portal, cpu_image, host_root, host_make
):
    host = host_make("gpu-local", gpus=0)
    host.sysfs_root = host.dev_root = str(host_root)

    seen_by_helper = hostfs.survey_through_engine(host)

    assert seen_by_helper.gpus == read_inventory(host_root)
    assert seen_by_helper.kfd_gid == KFD_GID
    assert seen_by_helper.render_gids == {minor: RENDER_GID for minor in MI300X_RENDER_MINORS}


def test_it_names_what_is_missing_on_the_host_when_discovery_fails(
    db, docker_portal, cpu_image, host_engine_mtls, host_root
):
    (host_root / "dev" / "kfd").unlink()

    with pytest.raises(InventoryError) as error:
        services.host_register(
            name="gpu-nokfd",
            private_address="127.0.0.1",
            sysfs_root=str(host_root),
            dev_root=str(host_root),
            **host_engine_mtls,
        )

    assert f"Host gpu-nokfd has no {host_root}/dev/kfd" in str(error.value)
    assert helper_containers(docker_portal) == []


def test_it_lets_uid_1000_open_its_kfd_and_render_node_on_a_remote_host_and_nothing_else(
    alice, remote_host, cpu_image
):
    instance, _, _ = launch(alice, remote_host, cpu_image, 144)
    name = container_name(instance.id)

    code, output = exec_in(name, "python3", "-c", OPEN_DEVICES, "/dev/kfd", "/dev/dri/renderD144")
    assert code == 0 and "opened" in output, output
    _, listing = exec_in(name, "ls", "/dev/dri")
    assert listing.split() == ["renderD144"]
    _, uid = exec_in(name, "id", "-u")
    assert uid.strip() == "1000"
    # The nodes open only for their groups (0660, non-root gids this machine's render group is not):
    # the container holds exactly the gids discovery read on the host.
    for node in (remote_host.dev_root + "/dev/kfd", remote_host.dev_root + "/dev/dri/renderD144"):
        assert stat.S_IMODE(os.stat(node).st_mode) == 0o660
    host_config = docker_client().containers.get(name).attrs["HostConfig"]
    assert host_config["GroupAdd"] == [str(RENDER_GID), str(KFD_GID)]


def test_it_publishes_jupyterlab_only_on_the_hosts_private_address(alice, remote_host, cpu_image):
    instance, _, result = launch(alice, remote_host, cpu_image, 136)

    attrs = docker_client().containers.get(container_name(instance.id)).attrs
    requested = [b["HostIp"] for bindings in attrs["HostConfig"]["PortBindings"].values() for b in bindings]
    published = [b["HostIp"] for bindings in attrs["NetworkSettings"]["Ports"].values() if bindings for b in bindings]
    assert requested and set(requested) == {"127.0.0.1"}
    assert published and set(published) == {"127.0.0.1"}
    assert result.endpoint == f"http://127.0.0.1:{result.state['host_port']}"
    # The gateway reaches JupyterLab there.
    wait_for_jupyter(result.endpoint, instance)


def test_it_reads_gpu_busy_percent_on_the_host_through_its_engine(remote_host, host_root, docker_portal):
    set_gpu_busy(host_root, 144, 73)

    assert hostfs.gpu_busy(remote_host, [136, 144]) == {136: 0, 144: 73}
    assert helper_containers(docker_portal) == []


def test_it_reads_gpu_health_on_the_host_through_its_engine_as_on_the_host_itself(
    remote_host, host_root, docker_portal
):
    (host_root / "sys/class/drm/renderD136/device/ras/umc_err_count").write_text("ue: 3\nce: 11\n")
    (host_root / "dev/dri/renderD144").unlink()
    # The same files read on this machine, as for a host whose engine is this machine's.
    local = GpuHost(name="same-files", sysfs_root=str(host_root), dev_root=str(host_root))

    through_engine = hostfs.gpu_health(remote_host, MI300X_RENDER_MINORS)

    assert through_engine == hostfs.gpu_health(local, MI300X_RENDER_MINORS)
    assert (through_engine[136].ras_uncorrectable, through_engine[136].ras_correctable) == (3, 11)
    assert through_engine[128].ras_uncorrectable == 0
    assert not through_engine[144].device_node
    assert all(reading.listed for reading in through_engine.values())
    assert helper_containers(docker_portal) == []
