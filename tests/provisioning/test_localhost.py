"""`make run` registers this machine as a GPU host by itself: simulated (the MI300X fixture topology and
stand-in device nodes that behave like real ones) where there is no AMD GPU, real where there is."""

import os
import stat

import pytest

from portal.instances.catalog import catalog_sync
from portal.instances.models import Image
from provisioning import localhost
from provisioning.models import GpuHost, HostImage, ImageJob
from tests.conftest import KFD_FIXTURES, MI300X_RENDER_MINORS

pytestmark = pytest.mark.django_db

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="stand-in device nodes need mknod (root)")


@pytest.fixture
def bare_machine(tmp_path):
    """A machine root with no sys/class/kfd: no AMD GPU."""
    return tmp_path / "machine"


@needs_root
def test_it_registers_a_simulated_8x_mi300x_host_whose_device_nodes_only_the_render_group_may_open(
    tmp_path, bare_machine
):
    local = localhost.local_host_ensure(var_dir=tmp_path, driver="local", machine_root=bare_machine)

    host = local.host
    assert local.simulated and host.is_simulated and host.state == GpuHost.State.ACTIVE
    assert host.name == localhost.SIMULATED_HOST_NAME
    assert sorted(host.gpus.values_list("render_minor", flat=True)) == MI300X_RENDER_MINORS
    nodes = [tmp_path / "simulated-gpus" / "dev" / "kfd"] + [
        tmp_path / "simulated-gpus" / "dev" / "dri" / f"renderD{minor}" for minor in MI300X_RENDER_MINORS
    ]
    for node in nodes:
        status = node.stat()
        assert stat.S_ISCHR(status.st_mode), node
        assert stat.S_IMODE(status.st_mode) == 0o660, node
        assert status.st_gid != 0, f"{node} is root's group: uid 1000 could open it only through root"


@needs_root
def test_it_registers_the_same_host_once_over_many_runs_and_keeps_an_operators_drain(tmp_path, bare_machine):
    first = localhost.local_host_ensure(var_dir=tmp_path, driver="local", machine_root=bare_machine)
    GpuHost.objects.filter(pk=first.host.pk).update(state=GpuHost.State.DRAINING)

    again = localhost.local_host_ensure(var_dir=tmp_path, driver="local", machine_root=bare_machine)

    assert GpuHost.objects.count() == 1
    assert again.host.pk == first.host.pk and again.host.gpus.count() == 8
    assert again.host.state == GpuHost.State.DRAINING
    assert any("reactivate it" in note for note in again.notes)


@needs_root
def test_it_registers_real_gpus_as_they_are_and_retires_the_simulated_host(tmp_path, bare_machine):
    localhost.local_host_ensure(var_dir=tmp_path, driver="local", machine_root=bare_machine)
    # A machine whose sysfs has a KFD topology (this fixture is a real 2-socket MI300X host's).
    real_machine = KFD_FIXTURES / "mi300x-2socket"

    local = localhost.local_host_ensure(var_dir=tmp_path, driver="local", machine_root=real_machine)

    assert not local.simulated and not local.host.is_simulated
    assert local.host.name == localhost.REAL_HOST_NAME
    assert local.host.sysfs_root == str(real_machine) and local.host.dev_root == str(real_machine)
    assert local.host.gpus.count() == 8
    simulated = GpuHost.objects.get(name=localhost.SIMULATED_HOST_NAME)
    assert simulated.state == GpuHost.State.RETIRED


@needs_root
def test_it_counts_only_gpu_free_images_as_startable_with_the_local_driver(tmp_path, bare_machine):
    catalog_sync()
    local = localhost.local_host_ensure(var_dir=tmp_path, driver="local", machine_root=bare_machine)

    survey = localhost.local_images_survey(host=local.host, driver="local")

    assert survey["cpu"] is True
    assert survey["pytorch"] is False
    cpu = Image.objects.get(key="cpu")
    assert HostImage.objects.get(host=local.host, reference=cpu.reference).present
    assert localhost.default_image_missing(survey) is None


def test_it_reads_how_far_a_cold_image_build_is_from_the_build_scripts_output():
    lines = [
        "build-images: debootstrap --variant=minbase --arch=amd64 bookworm from http://deb.debian.org/debian",
        "I: Retrieving Packages",
        "I: Extracting libc6...",
        "I: Base system installed successfully.",
        "build-images: docker import as devcloud/debian-base:bookworm-abc",
        "Step 1/10 : ARG BASE",
        "Step 6/10 : RUN python3 -m venv /opt/venv",
        "I: Retrieving a late line that must not move it back",
    ]
    percents = []
    percent = None
    for line in lines:
        percent = localhost.build_percent(line, percent)
        percents.append(percent)

    assert percents == sorted(percents), percents
    assert percents[0] == 2 and percents[5] == 50 and percents[6] == 75 and percents[-1] == 75


@needs_root
def test_a_build_cut_short_by_a_stopped_portal_is_marked_failed_when_the_next_run_builds_again(
    tmp_path, bare_machine
):
    catalog_sync()
    host = localhost.local_host_ensure(var_dir=tmp_path, driver="local", machine_root=bare_machine).host
    cpu = Image.objects.get(key="cpu")
    interrupted = localhost.image_job_for_local_build(host=host, image=cpu)

    again = localhost.image_job_for_local_build(host=host, image=cpu)

    interrupted.refresh_from_db()
    assert interrupted.state == ImageJob.State.FAILED
    assert "stopped while this build ran" in interrupted.error
    assert again.state == ImageJob.State.RUNNING
