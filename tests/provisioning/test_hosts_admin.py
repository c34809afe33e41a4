"""The operator's GPU host pages: add with a live engine check, the GPU map, and the host actions."""

import pytest
from django.urls import reverse

from provisioning import services
from provisioning.models import GpuHost
from provisioning.scheduler import allocate

from .test_hosts import LOCAL_ENGINE, unreachable_tls_engine

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/provisioning/gpuhost/add/"
CHANGELIST_URL = "/admin/provisioning/gpuhost/"


def host_form(**overrides):
    form = {
        "name": "gpu-01",
        "docker_url": LOCAL_ENGINE,
        "tls_ca_cert": "",
        "tls_client_cert": "",
        "tls_client_key": "",
        "sysfs_root": "/",
        "dev_root": "/",
        "state": "active",
        "cpus_per_gpu": "1.0",
        "memory_mb_per_gpu": "4096",
    }
    form.update(overrides)
    return form


def inline_data(host):
    """What the change page posts back for its read-only GPU inline."""
    gpus = list(host.gpus.order_by("node_id")) if host else []
    data = {
        "gpus-TOTAL_FORMS": len(gpus),
        "gpus-INITIAL_FORMS": len(gpus),
        "gpus-MIN_NUM_FORMS": 0,
        "gpus-MAX_NUM_FORMS": 1000,
    }
    for index, gpu in enumerate(gpus):
        data[f"gpus-{index}-id"] = gpu.pk
        data[f"gpus-{index}-host"] = host.pk
    return data


def change_url(host):
    return reverse("admin:provisioning_gpuhost_change", args=[host.pk])


def test_it_refuses_to_save_a_host_whose_engine_does_not_answer(olivia_client, kfd_sysfs_8gpu, host_pki):
    engine = unreachable_tls_engine(host_pki)
    url = engine["docker_url"]

    response = olivia_client.post(
        ADD_URL, host_form(**engine, private_address="127.0.0.1", sysfs_root=str(kfd_sysfs_8gpu))
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert f"Not saved: Cannot reach the Docker engine at {url}: Connection refused" in page
    assert not GpuHost.objects.exists()


def test_it_adds_a_reachable_host_and_discovers_its_gpus(olivia_client, kfd_sysfs_2socket):
    response = olivia_client.post(ADD_URL, host_form(sysfs_root=str(kfd_sysfs_2socket)), follow=True)

    host = GpuHost.objects.get(name="gpu-01")
    assert host.gpus.filter(is_present=True).count() == 8
    assert host.last_seen_at is not None
    page = response.content.decode()
    assert "Discovered gpu-01: 8 GPU(s) present; added nodes 2, 3, 4, 5, 6, 7, 8, 9" in page


def test_it_saves_a_host_whose_sysfs_is_not_there_yet_and_says_discovery_failed(olivia_client, tmp_path):
    response = olivia_client.post(ADD_URL, host_form(sysfs_root=str(tmp_path)), follow=True)

    assert GpuHost.objects.filter(name="gpu-01").exists()
    assert "Saved, but GPU discovery failed: No KFD topology at" in response.content.decode()


def test_it_shows_which_instance_holds_which_gpu_and_since_when(
    olivia_client, alice, kfd_sysfs_8gpu, host_queued_instance
):
    host = services.host_register(name="gpu-01", docker_url=LOCAL_ENGINE, sysfs_root=str(kfd_sysfs_8gpu))
    instance = host_queued_instance(alice)
    allocation = allocate(instance_id=instance.pk)[0]

    page = olivia_client.get(change_url(host)).content.decode()

    assert "Which instance holds which GPU" in page
    for minor in (128, 136, 184):
        assert f"/dev/dri/renderD{minor}" in page
    assert "05:00.0 (1280)" in page
    assert instance.short_id in page
    assert "alice@example.com" in page
    assert allocation.allocated_at.strftime("%Y-%m-%d %H:%M UTC") in page
    assert page.count("<td>free</td>") == 7


def test_it_never_shows_the_stored_client_key_and_keeps_it_when_left_blank(
    olivia_client, host_tls_engine, kfd_sysfs_8gpu
):
    host = services.host_register(
        name="gpu-tls", private_address="127.0.0.1", sysfs_root=str(kfd_sysfs_8gpu), discover=False, **host_tls_engine
    )
    secret_line = host_tls_engine["tls_client_key"].splitlines()[1]

    page = olivia_client.get(change_url(host)).content.decode()
    assert secret_line not in page

    form = host_form(
        name="gpu-tls",
        sysfs_root=str(kfd_sysfs_8gpu),
        docker_url=host_tls_engine["docker_url"],
        tls_ca_cert=host_tls_engine["tls_ca_cert"],
        tls_client_cert=host_tls_engine["tls_client_cert"],
        tls_client_key="",
        private_address="127.0.0.1",
    )
    response = olivia_client.post(change_url(host), {**form, **inline_data(host)})

    assert response.status_code == 302
    host.refresh_from_db()
    assert host.tls_client_key == host_tls_engine["tls_client_key"]


def test_it_checks_the_engine_again_when_its_address_changes(olivia_client, kfd_sysfs_8gpu, host_pki):
    host = services.host_register(name="gpu-01", docker_url=LOCAL_ENGINE, sysfs_root=str(kfd_sysfs_8gpu))

    form = host_form(
        **unreachable_tls_engine(host_pki), private_address="127.0.0.1", sysfs_root=str(kfd_sysfs_8gpu)
    )
    response = olivia_client.post(change_url(host), {**form, **inline_data(host)})

    assert "Not saved: Cannot reach the Docker engine" in response.content.decode()
    host.refresh_from_db()
    assert host.docker_url == LOCAL_ENGINE


def test_it_drains_and_reactivates_hosts_from_the_list(olivia_client, host_make):
    host = host_make("gpu-01")

    olivia_client.post(CHANGELIST_URL, {"action": "drain_hosts", "_selected_action": [host.pk], "reason": "Maintenance", "_confirm": "1"})
    host.refresh_from_db()
    assert host.state == GpuHost.State.DRAINING

    olivia_client.post(CHANGELIST_URL, {"action": "activate_hosts", "_selected_action": [host.pk], "reason": "Maintenance", "_confirm": "1"})
    host.refresh_from_db()
    assert host.state == GpuHost.State.ACTIVE


def test_it_discovers_gpus_from_the_list(olivia_client, kfd_sysfs_8gpu):
    host = services.host_register(
        name="gpu-01", docker_url=LOCAL_ENGINE, sysfs_root=str(kfd_sysfs_8gpu), discover=False
    )
    assert host.gpus.count() == 0

    response = olivia_client.post(
        CHANGELIST_URL, {"action": "discover_gpus", "_selected_action": [host.pk]}, follow=True
    )

    assert host.gpus.count() == 8
    # The admin capitalises the first letter of every message.
    assert "Gpu-01: 8 GPU(s) present; added nodes 1, 2, 3, 4, 5, 6, 7, 8" in response.content.decode()


def test_it_lists_hosts_with_their_gpus_in_use(olivia_client, alice, host_make, host_queued_instance):
    host_make("gpu-01")
    allocate(instance_id=host_queued_instance(alice).pk)

    page = olivia_client.get(CHANGELIST_URL).content.decode()

    assert "1 / 8" in page


def test_it_keeps_developers_out_of_the_host_pages(client, alice, host_make):
    host = host_make("gpu-01")
    client.force_login(alice)

    assert client.get(change_url(host)).status_code == 302
