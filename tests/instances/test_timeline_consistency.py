"""Whoever reads an instance's new state also reads the timeline line that goes with it.

The instance page and the API show the state and the timeline side by side. A reader on another
connection (the web process, while the worker moves the instance) must never see "running" without
"Ready" on the timeline, or "failed" without the reason.
"""

import threading
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from portal.credits import services as credits
from portal.instances import services, transitions
from portal.instances.models import Instance, InstanceEvent
from provisioning.drivers import fake

pytestmark = [pytest.mark.usefixtures("cloud"), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def provisioning(alice):
    credits.credits_adjust(
        user=alice, gpu_seconds=3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.PROVISIONING)
    instance.refresh_from_db()
    return instance


def read_from_another_connection(instance_id) -> tuple[str, list[str]]:
    """The instance's state and timeline as the web process would read them mid-move."""
    seen = {}

    def read():
        try:
            seen["state"] = Instance.objects.get(pk=instance_id).state
            seen["messages"] = list(
                InstanceEvent.objects.filter(instance_id=instance_id).values_list("message", flat=True)
            )
        finally:
            connection.close()

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    return seen["state"], seen["messages"]


@pytest.mark.parametrize(
    "move, state, line",
    [
        (
            lambda i: transitions.mark_running(i, ready_at=timezone.now()),
            "running",
            "Ready: JupyterLab is answering.",
        ),
        (
            lambda i: transitions.fail(i, reason="The image is broken: pick another."),
            "failed",
            "The image is broken: pick another.",
        ),
    ],
    ids=["running", "failed"],
)
def test_a_reader_never_sees_the_new_state_before_its_timeline_line(
    provisioning, monkeypatch, move, state, line
):
    record = transitions.event_record
    seen_while_recording = []

    def record_and_look(**kwargs):
        # The moment between the state's update and the line's insert: what does the web process see?
        seen_while_recording.append(read_from_another_connection(provisioning.pk))
        return record(**kwargs)

    monkeypatch.setattr(transitions, "event_record", record_and_look)
    assert move(provisioning)

    [(state_mid_move, messages_mid_move)] = seen_while_recording
    assert state_mid_move == "provisioning", "another connection read the new state before its timeline line"
    final_state, final_messages = read_from_another_connection(provisioning.pk)
    assert final_state == state
    assert final_messages[-1] == line
    assert final_messages[:-1] == messages_mid_move
