"""A host's registration and engine check say up front whether its engine can enforce the disk limits
(provisioning/drivers/docker_engine.disk_limit_support), and what that means under DEVCLOUD_DISK_LIMITS,
instead of the operator learning it from the first refused launch. This machine's engine keeps its data on
ext4 (overlay2, no project quotas), so it can enforce neither; tests/fleet/test_fleet_disk_limits.py
asks an engine that can."""

import html

import pytest
from django.urls import reverse

from provisioning import selectors
from provisioning.models import GpuHost
from tests.support.docker_instances import docker_client

from .test_hosts_admin import ADD_URL, host_form

pytestmark = pytest.mark.django_db

ENFORCE_WARNING = (
    "Gpu-01: Its engine (overlay2 on extfs) cannot limit the size of workspace volumes or containers' "
    "writable layers (quota size requested but no quota support). With DEVCLOUD_DISK_LIMITS=enforce, "
    "launches on this host will be refused: give its engine a data root on XFS mounted with pquota"
)
WARN_WARNING = (
    "Gpu-01: Its engine (overlay2 on extfs) cannot limit the size of workspace volumes or containers' "
    "writable layers (quota size requested but no quota support). With DEVCLOUD_DISK_LIMITS=warn, "
    "instances there run without that limit"
)


@pytest.fixture
def ext4_engine():
    client = docker_client()
    info = client.info()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem")
    if (info.get("Driver"), backing) != ("overlay2", "extfs"):
        pytest.skip(f"this machine's engine keeps its data on {info.get('Driver')}/{backing}, not overlay2/ext4")
    return client


def probe_volumes(client) -> list:
    return client.volumes.list(filters={"label": "devcloud.probe=true"})


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "warning"), [("enforce", ENFORCE_WARNING), ("warn", WARN_WARNING)])
def test_registering_a_host_on_this_machines_engine_warns_about_disk_limits(
    olivia_client, settings, kfd_sysfs_2socket, ext4_engine, policy, warning
):
    settings.DEVCLOUD_DISK_LIMITS = policy

    response = olivia_client.post(ADD_URL, host_form(sysfs_root=str(kfd_sysfs_2socket)), follow=True)

    host = GpuHost.objects.get(name="gpu-01")
    assert (host.can_limit_workspaces, host.can_limit_writable_layers) == (False, False)
    assert host.engine_storage == "overlay2 on extfs" and host.disk_limits_checked_at is not None
    assert warning in html.unescape(response.content.decode())
    # The trial volume is gone again.
    assert probe_volumes(ext4_engine) == []


@pytest.mark.slow
def test_check_engine_stores_the_answer_and_the_host_page_shows_it(
    olivia_client, settings, ext4_engine
):
    settings.DEVCLOUD_DISK_LIMITS = "enforce"
    host = GpuHost.objects.create(name="gpu-01", docker_url="unix:///var/run/docker.sock")

    checked = olivia_client.post(
        "/admin/provisioning/gpuhost/", {"action": "check_engines", "_selected_action": [host.pk]}, follow=True
    )
    page = olivia_client.get(reverse("admin:provisioning_gpuhost_change", args=[host.pk])).content.decode()

    assert ENFORCE_WARNING in html.unescape(checked.content.decode())
    shown = html.unescape(page.split('data-testid="disk-limits"', 1)[1].split("</p>", 1)[0])
    assert "launches on this host will be refused" in shown and "DEVCLOUD_DISK_LIMITS=warn" in shown


def test_a_host_never_asked_says_it_is_not_known_and_how_to_ask():
    host = GpuHost(name="gpu-01")

    note = selectors.disk_limits_note(host, policy="enforce")

    assert not note.ok
    assert "Not known whether its engine can enforce disk limits" in note.text
    assert "Check the Docker engine connection" in note.text


def test_an_engine_that_limits_both_is_said_to_enforce_them():
    host = GpuHost(
        name="gpu-01", can_limit_workspaces=True, can_limit_writable_layers=True, engine_storage="overlay2 on xfs"
    )

    note = selectors.disk_limits_note(host, policy="enforce")

    assert note.ok and note.text.startswith("Its engine (overlay2 on xfs) enforces both disk limits")


def test_an_engine_that_limits_only_writable_layers_names_the_workspace_alone():
    host = GpuHost(
        name="gpu-01",
        can_limit_workspaces=False,
        can_limit_writable_layers=True,
        engine_storage="btrfs on btrfs",
        disk_limits_reason="quota size requested but no quota support",
    )

    note = selectors.disk_limits_note(host, policy="warn")

    assert not note.ok
    assert "cannot limit the size of workspace volumes (quota size" in note.text
    assert "writable layers" not in note.text
