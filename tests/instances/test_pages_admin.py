"""The operator console for instances and images: find instances, read their timeline, force a stop,
switch images on and off. Developers cannot get in."""

import uuid

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from portal.credits import services as credits
from portal.instances import lifecycle, services
from portal.instances.models import Image, Instance
from provisioning.drivers import fake

pytestmark = pytest.mark.usefixtures("cloud")


@pytest.fixture
def running(alice, db):
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    fake.make_host("gpu-01")
    fake.make_image("cpu", name="CPU JupyterLab")
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    lifecycle.instance_provision(instance_id=instance.id)
    instance.refresh_from_db()
    return instance


def test_an_operator_finds_instances_by_state_and_owner(olivia_client, running):
    url = reverse("admin:instances_instance_changelist")

    running_page = olivia_client.get(url, {"state__exact": "running", "q": "alice@"})
    failed_page = olivia_client.get(url, {"state__exact": "failed"})

    assert running.short_id in running_page.content.decode()
    assert running.short_id not in failed_page.content.decode()


def test_an_operator_reads_the_timeline_and_the_gpus_held_but_not_the_token(olivia_client, running):
    page = olivia_client.get(reverse("admin:instances_instance_change", args=[running.id])).content.decode()

    assert "Ready: JupyterLab is answering." in page
    assert "gpu-01/renderD128" in page
    assert running.jupyter_token not in page


def test_an_operator_force_stops_an_instance(olivia_client, running):
    response = olivia_client.post(
        reverse("admin:instances_instance_changelist"),
        {"action": "force_stop", "_selected_action": [str(running.id)], "reason": "Maintenance", "_confirm": "1"},
        follow=True,
    )

    assert "Stopping 1 instance(s); each owner is told your reason." in response.content.decode()
    running.refresh_from_db()
    assert (running.stop_reason, running.stop_note) == ("operator", "Maintenance")
    assert running.events.last().message == "Stopped by an operator: Maintenance"


def test_an_operator_disables_an_image_and_launches_of_it_are_refused(olivia_client, running, alice):
    image = Image.objects.get(key="cpu")
    olivia_client.post(
        reverse("admin:instances_image_changelist"),
        {"action": "disable", "_selected_action": [str(image.pk)]},
    )

    assert Image.objects.get(pk=image.pk).is_enabled is False
    assert Instance.objects.get(pk=running.pk).state == Instance.State.RUNNING
    with pytest.raises(ValidationError, match="switched off by the operators"):
        services.instance_launch(user=alice, size="1x", image_key="cpu")


def test_a_developer_cannot_open_the_instance_console(alice_client, running):
    response = alice_client.get(reverse("admin:instances_instance_changelist"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
