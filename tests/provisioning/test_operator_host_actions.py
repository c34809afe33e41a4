"""Each host action takes its own operator permission: otto (the Operators group) drains, evicts, retires,
reactivates, discovers GPUs, checks engines and puts images on hosts; staff who may only view and change
hosts (provisioning.change_gpuhost, which also edits engine credentials) may do none of them. Discovery and
engine checks are audited like the rest."""

import pytest
from django.test import Client
from django.urls import reverse

from portal.audit.models import AuditEntry
from provisioning import services
from provisioning.drivers import fake
from provisioning.models import GpuHost, ImageJob
from tests.conftest import make_staff

from .test_hosts import closed_port

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cloud")]

CHANGELIST_URL = "/admin/provisioning/gpuhost/"
REASON = "Replacing a failed fan; back tomorrow."


@pytest.fixture
def gpu_01(db):
    return fake.make_host("gpu-01")


@pytest.fixture
def host_editor_client(db):
    """Staff who may view and edit hosts (what the host actions used to require), nothing more."""
    browser = Client()
    browser.force_login(
        make_staff("hank@ops.example.com", "provisioning.view_gpuhost", "provisioning.change_gpuhost")
    )
    return browser


def undiscovered_host(sysfs_root):
    return services.host_register(
        name="gpu-new", docker_url="unix:///nowhere", sysfs_root=str(sysfs_root), check=False, discover=False
    )


def confirm(action, hosts, **extra):
    return {"action": action, "_selected_action": [host.pk for host in hosts], "_confirm": "1", **extra}


def state_of(host):
    host.refresh_from_db()
    return host.state


def audited(action, actor):
    return list(AuditEntry.objects.filter(action=action, actor=actor))


def test_an_operator_drains_evicts_retires_and_reactivates_a_host(otto, otto_client, gpu_01):
    for action, state in [
        ("drain_hosts", GpuHost.State.DRAINING),
        ("activate_hosts", GpuHost.State.ACTIVE),
        ("evict_hosts", GpuHost.State.DRAINING),
        ("retire_hosts", GpuHost.State.RETIRED),
    ]:
        response = otto_client.post(CHANGELIST_URL, confirm(action, [gpu_01], reason=REASON))

        assert response.status_code == 302, action
        assert state_of(gpu_01) == state, action

    codes = list(AuditEntry.objects.filter(actor=otto).order_by("id").values_list("action", flat=True))
    assert codes == ["host.drain", "host.activate", "host.evict", "host.retire"]


def test_an_operator_drains_from_the_host_page(otto_client, gpu_01):
    page = otto_client.get(reverse("admin:provisioning_gpuhost_change", args=[gpu_01.pk])).content.decode()
    assert 'data-testid="host-op-drain"' in page

    otto_client.post(
        reverse("admin:provisioning_gpuhost_state", args=[gpu_01.pk, "drain"]),
        {"reason": REASON, "_confirm": "1"},
    )

    assert state_of(gpu_01) == GpuHost.State.DRAINING


def test_an_operator_discovers_gpus_and_it_is_audited(otto, otto_client, kfd_sysfs_8gpu):
    host = undiscovered_host(kfd_sysfs_8gpu)

    otto_client.post(CHANGELIST_URL, {"action": "discover_gpus", "_selected_action": [host.pk]})

    assert host.gpus.count() == 8
    [entry] = audited("host.discover", otto)
    assert entry.target_repr == "gpu-new" and "8 GPU(s) present" in entry.details["found"]


def test_an_operator_checks_an_engine_and_it_is_audited_even_when_it_does_not_answer(otto, otto_client, host_pki):
    url = f"tcp://127.0.0.1:{closed_port()}"
    host = GpuHost.objects.create(
        name="gpu-silent",
        docker_url=url,
        tls_ca_cert=host_pki.ca_cert,
        tls_client_cert=host_pki.client_cert,
        tls_client_key=host_pki.client_key,
    )

    response = otto_client.post(
        CHANGELIST_URL, {"action": "check_engines", "_selected_action": [host.pk]}, follow=True
    )

    assert f"Cannot reach the Docker engine at {url}" in response.content.decode()
    [entry] = audited("host.check", otto)
    assert entry.target_repr == "gpu-silent" and "Connection refused" in entry.details["error"]


def test_an_operator_puts_an_image_on_hosts_from_the_list_and_from_a_host_page(otto_client, gpu_01):
    gpu_02 = fake.make_host("gpu-02")
    image = fake.make_image("cpu")

    from_list = otto_client.post(CHANGELIST_URL, confirm("ensure_image_on_hosts", [gpu_01], image=image.pk))
    from_page = otto_client.post(
        reverse("admin:provisioning_gpuhost_ensure_image", args=[gpu_02.pk]), {"image": "cpu"}
    )

    assert (from_list.status_code, from_page.status_code) == (302, 302)
    assert sorted(ImageJob.objects.filter(image=image).values_list("host__name", flat=True)) == [
        "gpu-01",
        "gpu-02",
    ]


@pytest.mark.parametrize("action", ["drain_hosts", "evict_hosts", "retire_hosts", "activate_hosts"])
def test_staff_who_may_edit_hosts_cannot_change_their_state(host_editor_client, gpu_01, action):
    before = state_of(gpu_01)
    if action == "activate_hosts":
        GpuHost.objects.filter(pk=gpu_01.pk).update(state=GpuHost.State.DRAINING)
        before = GpuHost.State.DRAINING

    host_editor_client.post(CHANGELIST_URL, confirm(action, [gpu_01], reason=REASON))
    operation = action.removesuffix("_hosts")
    from_page = host_editor_client.post(
        reverse("admin:provisioning_gpuhost_state", args=[gpu_01.pk, operation]),
        {"reason": REASON, "_confirm": "1"},
    )

    assert from_page.status_code == 403
    assert state_of(gpu_01) == before
    assert not AuditEntry.objects.exists()


def test_staff_who_may_edit_hosts_cannot_discover_check_or_put_images(host_editor_client, kfd_sysfs_8gpu):
    host = undiscovered_host(kfd_sysfs_8gpu)
    image = fake.make_image("cpu")

    for action in ("discover_gpus", "check_engines"):
        host_editor_client.post(CHANGELIST_URL, {"action": action, "_selected_action": [host.pk]})
    host_editor_client.post(CHANGELIST_URL, confirm("ensure_image_on_hosts", [host], image=image.pk))
    from_page = host_editor_client.post(
        reverse("admin:provisioning_gpuhost_ensure_image", args=[host.pk]), {"image": "cpu"}
    )

    assert from_page.status_code == 403
    host.refresh_from_db()
    assert host.gpus.count() == 0 and host.last_error == ""
    assert not ImageJob.objects.exists()
    assert not AuditEntry.objects.exists()


def test_one_host_permission_opens_only_its_own_action(gpu_01):
    browser = Client()
    browser.force_login(
        make_staff("dana@ops.example.com", "provisioning.view_gpuhost", "console.drain_host")
    )

    browser.post(CHANGELIST_URL, confirm("evict_hosts", [gpu_01], reason=REASON))
    assert state_of(gpu_01) == GpuHost.State.ACTIVE
    browser.post(CHANGELIST_URL, confirm("drain_hosts", [gpu_01], reason=REASON))
    assert state_of(gpu_01) == GpuHost.State.DRAINING
