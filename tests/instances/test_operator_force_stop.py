"""Force-stopping an instance takes its own operator permission: otto (the Operators group) may, staff who
may change instances (instances.change_instance, what it used to require) may not."""

import uuid

import pytest
from django.test import Client
from django.urls import reverse

from portal.audit.models import AuditEntry
from portal.credits import services as credits
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from provisioning.drivers import fake
from tests.conftest import make_staff

pytestmark = pytest.mark.usefixtures("cloud")

CHANGELIST_URL = "/admin/instances/instance/"
REASON = "Mining cryptocurrency, which the terms forbid."


@pytest.fixture
def running(db, alice):
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    instance.refresh_from_db()
    return instance


def force_stop_url(instance):
    return reverse("admin:instances_instance_force_stop", args=[instance.id])


def confirm_force_stop(instance):
    return {"action": "force_stop", "_selected_action": [str(instance.id)], "reason": REASON, "_confirm": "1"}


def state_of(instance):
    instance.refresh_from_db()
    return instance.state


def test_an_operator_force_stops_from_the_list(otto, otto_client, running):
    response = otto_client.post(CHANGELIST_URL, confirm_force_stop(running))

    assert response.status_code == 302
    assert state_of(running) != Instance.State.RUNNING
    assert AuditEntry.objects.get(action="instance.force_stop").actor == otto


def test_an_operator_force_stops_from_the_instance_page(otto_client, running):
    page = otto_client.get(reverse("admin:instances_instance_change", args=[running.id])).content.decode()
    assert force_stop_url(running) in page

    response = otto_client.post(force_stop_url(running), {"reason": REASON, "_confirm": "1"})

    assert response.status_code == 302
    assert state_of(running) != Instance.State.RUNNING


def test_staff_who_may_change_instances_cannot_force_stop(running):
    browser = Client()
    browser.force_login(
        make_staff("ivan@ops.example.com", "instances.view_instance", "instances.change_instance")
    )

    browser.post(CHANGELIST_URL, confirm_force_stop(running))
    from_page = browser.post(force_stop_url(running), {"reason": REASON, "_confirm": "1"})
    page = browser.get(reverse("admin:instances_instance_change", args=[running.id])).content.decode()

    assert from_page.status_code == 403
    assert force_stop_url(running) not in page
    assert state_of(running) == Instance.State.RUNNING
    assert not AuditEntry.objects.filter(action="instance.force_stop").exists()
