"""The operator's instance pages: filters, the timeline, the log panel, and a force stop that needs a reason
the owner then reads; developers kept out."""

import uuid

import pytest
from django.test import Client
from django.urls import reverse

from portal.audit.models import AuditEntry
from portal.credits import services as credits
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from provisioning.drivers import fake

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cloud")]

CHANGELIST_URL = "/admin/instances/instance/"
REASON = "This instance was mining cryptocurrency, which the terms of use forbid."


@pytest.fixture
def launch(db):
    fake.make_host("gpu-01")
    fake.make_image("cpu", name="CPU JupyterLab")
    fake.make_image("pytorch", name="PyTorch")

    def run(user, image_key="cpu"):
        credits.credits_adjust(
            user=user, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
        )
        instance = services.instance_launch(user=user, size="1x", image_key=image_key)
        assert lifecycle.instance_provision(instance_id=instance.id) == "running"
        instance.refresh_from_db()
        return instance

    return run


def page_of(response) -> str:
    return response.content.decode()


def change_url(instance):
    return reverse("admin:instances_instance_change", args=[instance.id])


def confirm_force_stop(instances, reason):
    return {
        "action": "force_stop",
        "_selected_action": [str(i.id) for i in instances],
        "reason": reason,
        "_confirm": "1",
    }


# --- Finding instances ----------------------------------------------------------------------------------


def test_an_operator_filters_instances_by_state_owner_host_and_image(olivia_client, launch, alice, bob):
    alices, bobs = launch(alice), launch(bob, image_key="pytorch")
    fake.make_host("gpu-02")
    services.instance_stop(user=alice, instance_id=alices.id)

    def listed(**query):
        page = page_of(olivia_client.get(CHANGELIST_URL, query))
        return {instance.short_id for instance in (alices, bobs) if instance.short_id in page}

    assert listed(state__exact="running") == {bobs.short_id}
    assert listed(state__exact="stopping") == {alices.short_id}
    assert listed(owner="bob@example.com") == {bobs.short_id}
    assert listed(owner="alice@") == {alices.short_id}
    assert listed(image__id__exact=bobs.image_id) == {bobs.short_id}
    assert listed(host__id__exact=alices.host_id) == {alices.short_id, bobs.short_id}
    gpu_02 = alices.host.__class__.objects.get(name="gpu-02")
    assert listed(host__id__exact=gpu_02.pk) == set()


def test_the_owner_filter_keeps_the_other_filters(olivia_client, launch, alice):
    launch(alice)

    page = page_of(
        olivia_client.get(CHANGELIST_URL, {"state__exact": "running", "owner": "alice@example.com"})
    )

    assert '<input type="hidden" name="state__exact" value="running">' in page
    assert 'name="owner" value="alice@example.com"' in page
    # With the sidebar's "Show counts" on as well.
    assert olivia_client.get(CHANGELIST_URL, {"owner": "alice@", "_facets": "True"}).status_code == 200


# --- The instance's page --------------------------------------------------------------------------------


def test_the_instance_page_shows_the_timeline_of_state_changes(olivia_client, launch, alice):
    running = launch(alice)

    page = page_of(olivia_client.get(change_url(running)))

    timeline = page[page.index("Timeline") :]
    order = [
        timeline.index("Launch of CPU JupyterLab on 1x MI300X queued."),
        timeline.index("Allocating GPUs."),
        timeline.index("Waiting for JupyterLab to answer."),
        timeline.index("Ready: JupyterLab is answering."),
    ]
    assert order == sorted(order)
    assert running.jupyter_token not in page


def test_the_log_panel_says_when_nothing_was_printed_and_when_the_container_is_gone(
    olivia_client, launch, alice
):
    running = launch(alice)

    live_page = page_of(olivia_client.get(change_url(running)))
    services.instance_stop(user=alice, instance_id=running.id)
    lifecycle.instance_teardown(instance_id=running.id)
    ended_page = page_of(olivia_client.get(change_url(running)))

    assert "Container log (last 100 lines)" in live_page
    assert "The container has printed nothing yet." in live_page
    assert "No container: it is removed when the instance ends (the workspace volume is kept)." in ended_page


# --- Force stop -----------------------------------------------------------------------------------------


def test_a_force_stop_needs_a_reason(olivia_client, launch, alice, mailoutbox):
    running = launch(alice)

    reason_page = page_of(
        olivia_client.post(
            CHANGELIST_URL, {"action": "force_stop", "index": "0", "_selected_action": [str(running.id)]}
        )
    )
    refused = page_of(olivia_client.post(CHANGELIST_URL, confirm_force_stop([running], "   ")))

    assert f"{running.short_id}: alice@example.com" in reason_page
    assert "Give the reason: the owner is told it." in refused
    running.refresh_from_db()
    assert running.state == Instance.State.RUNNING
    assert not AuditEntry.objects.filter(action="instance.force_stop").exists()
    assert mailoutbox == []


def test_a_force_stop_stops_tells_the_owner_why_and_is_audited(
    olivia_client, olivia, launch, alice, bob, cloud, mailoutbox, django_capture_on_commit_callbacks
):
    running, bystander = launch(alice), launch(bob)

    with django_capture_on_commit_callbacks(execute=True):
        response = olivia_client.post(CHANGELIST_URL, confirm_force_stop([running], REASON), follow=True)

    assert "Stopping 1 instance(s); each owner is told your reason." in page_of(response)
    running.refresh_from_db()
    bystander.refresh_from_db()
    assert (running.state, running.stop_reason, running.stop_note) == (Instance.State.STOPPED, "operator", REASON)
    assert str(running.id) not in cloud.containers
    assert bystander.state == Instance.State.RUNNING
    [mail] = mailoutbox
    assert mail.to == ["alice@example.com"] and f"Reason given: {REASON}" in mail.body
    [entry] = AuditEntry.objects.filter(action="instance.force_stop")
    assert (entry.actor, entry.reason, entry.target_id) == (olivia, REASON, str(running.id))
    assert entry.details == {"owner": "alice@example.com", "previous_state": "running", "host": "gpu-01"}

    alice_client = Client()
    alice_client.force_login(alice)
    instance_page = page_of(alice_client.get(reverse("instances:detail", args=[running.id])))
    status = alice_client.get(reverse("instances:status", args=[running.id])).json()
    assert REASON in instance_page
    assert REASON in status["stop_reason"]
    assert running.events.filter(message=f"Stopped by an operator: {REASON}").exists()


def test_an_operator_force_stops_from_the_instance_page(olivia_client, launch, alice):
    running = launch(alice)
    url = reverse("admin:instances_instance_force_stop", args=[running.id])

    instance_page = page_of(olivia_client.get(change_url(running)))
    response = olivia_client.post(url, {"reason": REASON, "_confirm": "1"})

    assert url in instance_page
    assert response.status_code == 302 and response["Location"] == change_url(running)
    running.refresh_from_db()
    assert running.state == Instance.State.STOPPING
    assert (running.stop_reason, running.stop_note) == ("operator", REASON)


def test_a_force_stop_leaves_ended_instances_alone_and_says_so(olivia_client, launch, alice, mailoutbox):
    running = launch(alice)
    services.instance_stop(user=alice, instance_id=running.id)
    lifecycle.instance_teardown(instance_id=running.id)

    reason_page = page_of(
        olivia_client.post(
            CHANGELIST_URL, {"action": "force_stop", "index": "0", "_selected_action": [str(running.id)]}
        )
    )
    response = olivia_client.post(CHANGELIST_URL, confirm_force_stop([running], REASON), follow=True)

    assert "None of the selected instances is live; there is nothing to stop." in reason_page
    assert "1 had already stopped or failed." in page_of(response)
    running.refresh_from_db()
    assert running.stop_reason == "user"
    assert not AuditEntry.objects.filter(action="instance.force_stop").exists()


def test_a_reason_too_long_for_the_owners_page_is_refused(olivia_client, launch, alice):
    running = launch(alice)

    refused = page_of(olivia_client.post(CHANGELIST_URL, confirm_force_stop([running], "x" * 201)))

    assert "Ensure this value has at most 200 characters (it has 201)." in refused
    running.refresh_from_db()
    assert running.state == Instance.State.RUNNING


# --- Developers are kept out ----------------------------------------------------------------------------


def test_developers_are_refused_the_instance_console(launch, alice, bob):
    running = launch(alice)
    client = Client()
    client.force_login(bob)

    for response in (
        client.get(reverse("admin:instances_instance_force_stop", args=[running.id])),
        client.post(
            reverse("admin:instances_instance_force_stop", args=[running.id]),
            {"reason": "x", "_confirm": "1"},
        ),
        client.post(CHANGELIST_URL, confirm_force_stop([running], "x")),
        client.get(change_url(running)),
    ):
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")

    running.refresh_from_db()
    assert running.state == Instance.State.RUNNING
    assert not AuditEntry.objects.filter(action="instance.force_stop").exists()
