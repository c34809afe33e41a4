"""Disk limits on real engines: an instance that writes past its size's limit gets ENOSPC (or EDQUOT)
inside its container, and the host's disk is used no further than the limit; a host whose engine cannot
enforce a limit refuses the launch and says what the operator can do (DEVCLOUD_DISK_LIMITS=enforce).

The tests run on a host whose data root enforces what this kernel allows (tests/support/fleet.py): the
fleet's hosts on XFS with pquota, which limits both workspace volumes and writable layers; on a kernel
without XFS quotas, a host added on btrfs, which limits writable layers, and whose engine refuses a
size-limited volume."""

import shutil
import uuid

import pytest

from portal.credits import services as credits
from portal.instances import lifecycle, services
from provisioning import console_calls
from provisioning.drivers.docker import container_name
from provisioning.drivers.docker_engine import volume_name
from provisioning.models import Gpu, GpuHost
from provisioning.workspaces import HELPER_LABEL
from tests.support.docker_instances import make_image, remove_portal_objects
from tests.support.fleet import quota_filesystem

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600, func_only=True)]

GB = 1000**3
# Room for what the filesystem itself writes alongside the data (metadata, the engine's own files).
SLACK_BYTES = 96 * 1024**2

# Writes zeros to PATH in 1 MiB chunks until TOTAL bytes or an error; prints the errno's name and the bytes
# written. fsync per chunk, so the filesystem's limit is met while writing, not at close.
FILL = r"""
import errno, os, sys
path, total = sys.argv[1], int(sys.argv[2])
written, chunk, error = 0, b"\0" * (1 << 20), "none"
try:
    with open(path, "wb") as handle:
        while written < total:
            written += handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
except OSError as failure:
    error = errno.errorcode.get(failure.errno, str(failure.errno))
print(error, written)
"""


@pytest.fixture(scope="module")
def disk_host(fleet):
    """A fleet host whose data root can enforce disk limits (see the module's docstring)."""
    if quota_filesystem() == "xfs":
        yield fleet.hosts[0]
        return
    host = fleet.add_host(filesystem="btrfs")
    yield host
    fleet.remove_host(host)


@pytest.fixture(scope="module")
def image(fleet, disk_host, fleet_cpu_image):
    fleet.pull(disk_host, fleet_cpu_image)
    return fleet_cpu_image


@pytest.fixture
def portal(disk_host, settings):
    portal_id = f"test-disk-{uuid.uuid4().hex[:10]}"
    settings.DEVCLOUD_PORTAL_ID = portal_id
    settings.DEVCLOUD_DRIVER = "docker"
    settings.READY_TIMEOUT_SECONDS = 120
    settings.DEVCLOUD_DISK_LIMITS = "enforce"
    yield portal_id
    client = disk_host.client()
    for container in client.containers.list(all=True, ignore_removed=True, filters={"label": HELPER_LABEL}):
        container.remove(force=True)
    remove_portal_objects(portal_id, client)
    client.close()


@pytest.fixture
def host(db, disk_host, portal):
    fleet_host = disk_host
    row = GpuHost.objects.create(
        **fleet_host.gpuhost_fields(), kfd_gid=fleet_host.render_gid, cpus_per_gpu=0.5, memory_mb_per_gpu=512
    )
    Gpu.objects.bulk_create(
        [
            Gpu(host=row, node_id=n + 1, gpu_id=60000 + n, render_minor=minor, render_gid=fleet_host.render_gid)
            for n, minor in enumerate(fleet_host.render_minors)
        ]
    )
    return row


@pytest.fixture
def launch(alice, host, image):
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    catalogue_image = make_image(image, key="cpu-disk")

    def make(expect="running"):
        instance = services.instance_launch(user=alice, size="1x", image_key=catalogue_image.key)
        outcome = lifecycle.instance_provision(instance_id=instance.id)
        instance.refresh_from_db()
        assert outcome == expect, instance.failure_reason or timeline(instance)
        return instance

    return make


def timeline(instance) -> str:
    return "\n".join(instance.events.values_list("message", flat=True))


def fill(disk_host, instance, path: str, total: int) -> tuple[str, int]:
    container = disk_host.client(timeout=600).containers.get(container_name(instance.id))
    code, output = container.exec_run(["python3", "-c", FILL, path, str(total)], user="1000:1000")
    assert code == 0, output
    error, written = output.decode().split()
    return error, int(written)


def used(disk_host) -> int:
    return shutil.disk_usage(disk_host.data_root).used


def test_it_stops_an_instance_writing_past_its_disk_limit_outside_the_workspace(disk_host, launch, settings):
    settings.DEVCLOUD_WORKSPACE_GB = {}
    settings.DEVCLOUD_CONTAINER_DISK_GB = {"1x": 1}
    instance = launch()
    before = used(disk_host)

    error, written = fill(disk_host, instance, "/home/developer/fill", 3 * GB)

    assert error in ("ENOSPC", "EDQUOT"), f"{written} bytes written without an error"
    assert written < GB
    assert used(disk_host) - before <= GB + SLACK_BYTES


def test_a_workspace_never_outgrows_its_limit(disk_host, launch, settings, portal):
    """Where the engine can limit a volume (XFS with pquota), a full /workspace gives ENOSPC and the host
    keeps its space; where it cannot (this kernel has no XFS quotas), the launch is refused, saying why,
    and leaves nothing behind. The fleet's filesystem decides which of the two this machine proves."""
    settings.DEVCLOUD_WORKSPACE_GB = {"1x": 1}
    settings.DEVCLOUD_CONTAINER_DISK_GB = {}
    if disk_host.filesystem == "xfs":
        instance = launch()
        before = used(disk_host)

        error, written = fill(disk_host, instance, "/workspace/fill", 3 * GB)

        assert error == "ENOSPC", f"{written} bytes written without ENOSPC"
        assert written <= GB
        assert used(disk_host) - before <= GB + SLACK_BYTES
        return

    instance = launch(expect="failed")

    assert "cannot limit the size of a /workspace" in instance.failure_reason
    assert "XFS" in instance.failure_reason and "DEVCLOUD_DISK_LIMITS=warn" in instance.failure_reason
    client = disk_host.client()
    assert client.volumes.list(filters={"name": volume_name(instance.user.workspace_key.hex)}) == []
    assert (
        client.containers.list(all=True, ignore_removed=True, filters={"label": f"devcloud.portal={portal}"})
        == []
    )


def test_under_warn_it_starts_without_the_limit_and_records_that(disk_host, launch, settings):
    settings.DEVCLOUD_DISK_LIMITS = "warn"
    settings.DEVCLOUD_WORKSPACE_GB = {"1x": 1}
    settings.DEVCLOUD_CONTAINER_DISK_GB = {"1x": 1}

    instance = launch()

    # An XFS engine enforces both limits; this kernel's btrfs engine only the writable layer's.
    unenforced = [] if disk_host.filesystem == "xfs" else ["workspace"]
    assert instance.driver_state.get("disk_limits_unenforced", []) == unenforced
    # The writable layer is still limited: btrfs enforces that part.
    error, _ = fill(disk_host, instance, "/home/developer/fill", 3 * GB)
    assert error in ("ENOSPC", "EDQUOT"), timeline(instance)


def test_checking_the_host_says_up_front_which_limits_its_engine_enforces(disk_host, host):
    """What registration and "Check the Docker engine connection" store (through the worker), read from
    the same engine the launches above find out from."""
    console_calls.host_check(host_id=host.pk)

    host.refresh_from_db()
    assert host.can_limit_writable_layers is True, host.disk_limits_reason
    if disk_host.filesystem == "xfs":
        assert host.can_limit_workspaces is True and host.engine_storage == "overlay2 on xfs"
    else:
        assert host.can_limit_workspaces is False and host.engine_storage.startswith("btrfs")
        assert "quota" in host.disk_limits_reason
    assert disk_host.client().volumes.list(filters={"label": "devcloud.probe=true"}) == []
