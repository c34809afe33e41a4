"""The operator's host actions: drain, cordon and evict, retire and reactivate, each confirmed with a reason
and audited; their effect on the instances running there; the GPU map's holders; developers kept out."""

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from portal.audit.models import AuditEntry
from portal.credits import services as credits
from portal.instances import lifecycle
from portal.instances import services as instance_services
from portal.instances import services as instances
from portal.instances.models import Instance
from portal.instances.selectors import stop_reason_text
from portal.notifications.models import Notification
from provisioning import scheduler, services
from provisioning.drivers import fake
from provisioning.models import GpuAllocation, GpuHost, ImageJob
from tests.conftest import mails_to

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cloud")]

CHANGELIST_URL = "/admin/provisioning/gpuhost/"
REASON = "Replacing a failed fan on gpu-01; back tomorrow."


@pytest.fixture
def gpu_01(db):
    return fake.make_host("gpu-01")


@pytest.fixture
def gpu_02(db):
    return fake.make_host("gpu-02")


@pytest.fixture
def launch(db, gpu_01):
    """launch(user) gives the user credit and returns their instance, running (on gpu-01 unless it is full)."""
    fake.make_image("cpu", name="CPU JupyterLab")

    def run(user):
        credits.credits_adjust(
            user=user, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
        )
        instance = instances.instance_launch(user=user, size="1x", image_key="cpu")
        assert lifecycle.instance_provision(instance_id=instance.id) == "running"
        instance.refresh_from_db()
        return instance

    return run


def choose(action, hosts):
    """The changelist's first post: the action and the ticked hosts."""
    return {"action": action, "index": "0", "_selected_action": [host.pk for host in hosts]}


def confirm(action, hosts, reason):
    """What the confirmation page posts back."""
    return {
        "action": action,
        "_selected_action": [host.pk for host in hosts],
        "reason": reason,
        "_confirm": "1",
    }


def audit_of(action):
    return list(AuditEntry.objects.filter(action=action))


def page_of(response) -> str:
    return response.content.decode()


# --- Drain ----------------------------------------------------------------------------------------------


def test_it_asks_for_a_reason_before_draining(olivia_client, gpu_01, launch, alice):
    running = launch(alice)

    page = page_of(olivia_client.post(CHANGELIST_URL, choose("drain_hosts", [gpu_01])))
    refused = page_of(olivia_client.post(CHANGELIST_URL, confirm("drain_hosts", [gpu_01], "  ")))

    assert "Instances already there keep running" in page
    assert running.short_id in page and "alice@example.com" in page
    assert "Give a reason: it is recorded with the action." in refused
    gpu_01.refresh_from_db()
    assert gpu_01.state == GpuHost.State.ACTIVE
    assert audit_of("host.drain") == []


def test_it_drains_a_host_and_its_running_instances_keep_running(
    olivia_client, olivia, gpu_01, launch, alice, bob, cloud
):
    running = launch(alice)

    response = olivia_client.post(CHANGELIST_URL, confirm("drain_hosts", [gpu_01], REASON), follow=True)

    assert "Draining gpu-01: nothing new is placed there; 1 live instance(s) keep running." in page_of(
        response
    )
    gpu_01.refresh_from_db()
    running.refresh_from_db()
    assert gpu_01.state == GpuHost.State.DRAINING
    assert running.state == Instance.State.RUNNING
    assert str(running.id) in cloud.containers
    [entry] = audit_of("host.drain")
    assert (entry.actor, entry.reason, entry.target_repr) == (olivia, REASON, "gpu-01")
    assert entry.details == {"previous_state": "active", "live_instances": 1}
    # Seven GPUs are free there, yet a new launch waits: a draining host takes nothing new.
    credits.credits_adjust(user=bob, gpu_seconds=3600, reason="Test", actor=None, idempotency_key="bob-1")
    waiting = instances.instance_launch(user=bob, size="1x", image_key="cpu")
    assert lifecycle.instance_provision(instance_id=waiting.id) == "queued"


def test_it_reactivates_a_drained_host_with_a_reason(olivia_client, olivia, gpu_01):
    services.host_drain(host_id=gpu_01.pk, actor=olivia, reason="Maintenance")

    olivia_client.post(CHANGELIST_URL, confirm("activate_hosts", [gpu_01], "Fan replaced"))

    gpu_01.refresh_from_db()
    assert gpu_01.state == GpuHost.State.ACTIVE
    [entry] = audit_of("host.activate")
    assert (entry.reason, entry.details["previous_state"]) == ("Fan replaced", "draining")


# --- Cordon and evict -----------------------------------------------------------------------------------


def test_it_evicts_a_host_stopping_every_instance_and_telling_each_owner_once(
    olivia_client,
    olivia,
    gpu_01,
    gpu_02,
    launch,
    alice,
    bob,
    cloud,
    mailoutbox,
    django_capture_on_commit_callbacks,
):
    alices, bobs = launch(alice), launch(bob)
    GpuHost.objects.filter(pk=gpu_01.pk).update(state=GpuHost.State.DRAINING)
    elsewhere = launch(alice)  # gpu-01 takes nothing new, so this one lands on gpu-02
    GpuHost.objects.filter(pk=gpu_01.pk).update(state=GpuHost.State.ACTIVE)
    assert (alices.host, bobs.host, elsewhere.host) == (gpu_01, gpu_01, gpu_02)

    confirmation = page_of(olivia_client.post(CHANGELIST_URL, choose("evict_hosts", [gpu_01])))
    with django_capture_on_commit_callbacks(execute=True):
        response = olivia_client.post(CHANGELIST_URL, confirm("evict_hosts", [gpu_01], REASON), follow=True)

    assert confirmation.count("(will be stopped)") == 2
    assert "Evicted gpu-01: it is draining, 2 instance(s) stopped and their owners told." in page_of(response)
    gpu_01.refresh_from_db()
    assert gpu_01.state == GpuHost.State.DRAINING
    for instance in (alices, bobs):
        instance.refresh_from_db()
        # The teardown ran (eagerly, once the stop committed): the container is gone and the GPU is free.
        assert (instance.state, instance.stop_reason) == (Instance.State.STOPPED, "host_evicted")
        assert str(instance.id) not in cloud.containers
        assert not GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).exists()
    elsewhere.refresh_from_db()
    assert elsewhere.state == Instance.State.RUNNING
    for owner in (alice, bob):
        [mail] = mails_to(mailoutbox, owner)
        assert f"Reason given: {REASON}" in mail.body
    [entry] = audit_of("host.evict")
    assert (entry.actor, entry.reason) == (olivia, REASON)
    assert sorted(entry.details["instances"]) == sorted([str(alices.id), str(bobs.id)])

    # Evicting again finds nothing left to stop and tells nobody anything twice.
    with django_capture_on_commit_callbacks(execute=True):
        olivia_client.post(CHANGELIST_URL, confirm("evict_hosts", [gpu_01], REASON))
    assert len(mailoutbox) == 2
    assert Notification.objects.filter(kind="instance_stopped").count() == 2


def test_the_owner_sees_that_an_operator_stopped_their_instance(olivia, gpu_01, launch, alice):
    running = launch(alice)

    instance_services.host_evict(host_id=gpu_01.pk, actor=olivia, reason=REASON)

    alice_client = Client()
    alice_client.force_login(alice)
    page = page_of(alice_client.get(reverse("instances:detail", args=[running.id])))
    running.refresh_from_db()
    assert running.stop_reason == "host_evicted"
    assert escape(stop_reason_text(running)) in page
    assert running.events.last().message == f"Stopped by an operator, who is evicting host gpu-01: {REASON}"


def test_it_refuses_to_evict_without_a_reason(olivia, gpu_01, launch, alice):
    running = launch(alice)

    with pytest.raises(ValueError, match="needs a reason"):
        instance_services.host_evict(host_id=gpu_01.pk, actor=olivia, reason=" ")

    running.refresh_from_db()
    assert running.state == Instance.State.RUNNING
    assert audit_of("host.evict") == []


def test_evicting_leaves_an_instance_that_is_already_stopping_to_finish(
    olivia, gpu_01, launch, alice, mailoutbox
):
    stopping = launch(alice)
    instances.instance_stop(user=alice, instance_id=stopping.id)

    summary = instance_services.host_evict(host_id=gpu_01.pk, actor=olivia, reason=REASON)

    assert (summary.stopped, [i.id for i in summary.already_stopping]) == ([], [stopping.id])
    stopping.refresh_from_db()
    assert stopping.stop_reason == "user"
    assert not Notification.objects.exists()


# --- Retire ---------------------------------------------------------------------------------------------


def test_it_refuses_to_retire_a_host_with_live_instances(olivia_client, gpu_01, launch, alice):
    running = launch(alice)

    confirmation = page_of(olivia_client.post(CHANGELIST_URL, choose("retire_hosts", [gpu_01])))
    response = olivia_client.post(
        CHANGELIST_URL, confirm("retire_hosts", [gpu_01], "Decommissioned"), follow=True
    )

    assert "cannot be retired until it stops" in confirmation
    assert (
        f"Not changed: gpu-01 still has 1 live instance(s): {running.short_id} (running). Drain it and wait for them to "
        "stop, or cordon and evict it, then retire it."
    ) in page_of(response)
    gpu_01.refresh_from_db()
    assert gpu_01.state == GpuHost.State.ACTIVE
    assert audit_of("host.retire") == []


def test_it_retires_an_emptied_host_whose_gpus_then_get_nothing(
    olivia_client, olivia, gpu_01, launch, alice, bob, django_capture_on_commit_callbacks
):
    launch(alice)
    with django_capture_on_commit_callbacks(execute=True):
        instance_services.host_evict(host_id=gpu_01.pk, actor=olivia, reason=REASON)

    olivia_client.post(CHANGELIST_URL, confirm("retire_hosts", [gpu_01], "Decommissioned"))

    gpu_01.refresh_from_db()
    assert gpu_01.state == GpuHost.State.RETIRED
    [entry] = audit_of("host.retire")
    assert (entry.actor, entry.reason, entry.details) == (
        olivia,
        "Decommissioned",
        {"previous_state": "draining"},
    )
    credits.credits_adjust(user=bob, gpu_seconds=3600, reason="Test", actor=None, idempotency_key="bob-1")
    waiting = instances.instance_launch(user=bob, size="1x", image_key="cpu")
    assert scheduler.allocate(instance_id=waiting.id) is None
    # Draining it again would quietly bring it back: an operator must mark it active on purpose.
    with pytest.raises(services.HostError, match="gpu-01 is retired; mark it active first"):
        services.host_drain(host_id=gpu_01.pk, actor=olivia, reason="oops")


# --- From the host's own page ---------------------------------------------------------------------------


def test_the_host_page_offers_each_state_change_behind_a_confirmation(
    olivia_client, olivia, gpu_01, launch, alice
):
    running = launch(alice)
    evict_url = reverse("admin:provisioning_gpuhost_state", args=[gpu_01.pk, "evict"])

    host_page = page_of(olivia_client.get(reverse("admin:provisioning_gpuhost_change", args=[gpu_01.pk])))
    confirmation = page_of(olivia_client.get(evict_url))
    response = olivia_client.post(evict_url, {"reason": REASON, "_confirm": "1"})

    assert evict_url in host_page
    assert f"{running.short_id}: alice@example.com" in confirmation
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:provisioning_gpuhost_change", args=[gpu_01.pk])
    running.refresh_from_db()
    assert running.state == Instance.State.STOPPING
    assert audit_of("host.evict")[0].reason == REASON


def test_the_state_is_not_editable_on_the_host_form(olivia_client, gpu_01):
    page = page_of(olivia_client.get(reverse("admin:provisioning_gpuhost_change", args=[gpu_01.pk])))

    assert 'name="state"' not in page


# --- GPU map --------------------------------------------------------------------------------------------


def test_the_gpu_map_shows_which_instance_holds_each_gpu_and_for_how_long(
    olivia_client, gpu_01, launch, alice
):
    running = launch(alice)
    GpuAllocation.objects.filter(instance=running).update(
        allocated_at=timezone.now() - timedelta(hours=2, minutes=5, seconds=10)
    )

    page = page_of(olivia_client.get(reverse("admin:provisioning_gpuhost_change", args=[gpu_01.pk])))

    assert "<th>Held for</th>" in page
    row = next(line for line in page.split("<tr>") if "/dev/dri/renderD128" in line)
    assert running.short_id in row and "alice@example.com" in row
    assert "2\xa0hours, 5\xa0minutes" in row
    assert page.count("<td>free</td>") == 7


# --- Developers are kept out ----------------------------------------------------------------------------


def test_developers_are_refused_every_host_console_view(gpu_01, launch, alice):
    running = launch(alice)
    job = ImageJob.objects.create(host=gpu_01, image=running.image, reference=running.image.reference)
    client = Client()
    client.force_login(alice)
    posts = [
        (CHANGELIST_URL, confirm("evict_hosts", [gpu_01], "mine now")),
        (CHANGELIST_URL, confirm("retire_hosts", [gpu_01], "mine now")),
        (
            reverse("admin:provisioning_gpuhost_state", args=[gpu_01.pk, "drain"]),
            {"reason": "x", "_confirm": "1"},
        ),
        (reverse("admin:provisioning_gpuhost_ensure_image", args=[gpu_01.pk]), {"image": "cpu"}),
    ]
    gets = [
        reverse("admin:provisioning_gpuhost_state", args=[gpu_01.pk, "evict"]),
        reverse("admin:provisioning_gpuhost_image_jobs") + f"?ids={job.pk}",
        reverse("admin:provisioning_gpuhost_image_jobs_status") + f"?ids={job.pk}",
        reverse("admin:provisioning_gpuhost_image_jobs_status") + f"?host={gpu_01.pk}",
    ]

    for url, data in posts:
        response = client.post(url, data)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url
    for url in gets:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url

    gpu_01.refresh_from_db()
    running.refresh_from_db()
    assert (gpu_01.state, running.state) == (GpuHost.State.ACTIVE, Instance.State.RUNNING)
    assert not AuditEntry.objects.filter(action__startswith="host.").exists()
    assert ImageJob.objects.count() == 1


def test_staff_without_the_change_permission_cannot_change_a_hosts_state(gpu_01):
    from tests.conftest import make_user

    viewer = make_user("victor@ops.example.com", staff=False)
    viewer.is_staff = True
    viewer.save(update_fields=["is_staff"])
    client = Client()
    client.force_login(viewer)

    response = client.post(
        reverse("admin:provisioning_gpuhost_state", args=[gpu_01.pk, "retire"]),
        {"reason": "x", "_confirm": "1"},
    )

    assert response.status_code == 403
    gpu_01.refresh_from_db()
    assert gpu_01.state == GpuHost.State.ACTIVE


def test_adding_a_host_is_audited(olivia_client, olivia, kfd_sysfs_8gpu):
    form = {
        "name": "gpu-new",
        "docker_url": "unix:///var/run/docker.sock",
        "sysfs_root": str(kfd_sysfs_8gpu),
        "dev_root": "/",
        "state": "draining",
        "cpus_per_gpu": "1.0",
        "memory_mb_per_gpu": "4096",
    }

    olivia_client.post("/admin/provisioning/gpuhost/add/", form)

    [entry] = audit_of("host.add")
    assert (entry.actor, entry.target_repr) == (olivia, "gpu-new")
    assert entry.details == {"docker_url": "unix:///var/run/docker.sock", "state": "draining"}
