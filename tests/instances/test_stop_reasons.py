"""Every way an instance stops records one of the StopReason words (and the operator's own words as the
note), and its owner reads the matching sentence on the instance's page."""

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from portal.accounts.services import account_delete, user_suspend
from portal.credits import services as credits
from portal.credits.selectors import balance_for
from portal.instances import lifecycle, limits, services
from portal.instances.models import Instance
from portal.instances.selectors import stop_reason_text
from portal.instances.stop_reasons import StopReason
from provisioning.drivers import fake

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600


@pytest.fixture
def running(alice, db):
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    instance.refresh_from_db()
    return instance


def stop_by_owner(instance, olivia):
    services.instance_stop(user=instance.user, instance_id=instance.id)


def stop_when_credits_run_out(instance, olivia):
    credits.credits_adjust(
        user=instance.user,
        gpu_seconds=-balance_for(instance.user),
        reason="Correction",
        actor=olivia,
        idempotency_key=str(uuid.uuid4()),
    )
    lifecycle.meter_tick()


def stop_by_operator(instance, olivia):
    services.instance_force_stop(instance_id=instance.id, actor=olivia, reason="Disk check on the host")


def stop_at_max_length(instance, olivia):
    limits.enforce_max_session_length(now=instance.ready_at + timedelta(hours=13))


def stop_by_suspension(instance, olivia):
    user_suspend(user=instance.user, actor=olivia, reason="Mining")


def stop_by_eviction(instance, olivia):
    services.host_evict(host_id=instance.host_id, actor=olivia, reason="Rack move")


STOPS = [
    (stop_by_owner, StopReason.USER, "", "You stopped it."),
    (stop_when_credits_run_out, StopReason.CREDITS_EXHAUSTED, "", "DevCloud stopped it because your credits ran out."),
    (stop_by_operator, StopReason.OPERATOR, "Disk check on the host", "An operator stopped it: Disk check on the host"),
    (stop_at_max_length, StopReason.MAX_LENGTH, "", "It reached the longest a session may run at its size"),
    (stop_by_suspension, StopReason.SUSPENDED, "", "It was stopped because your account was suspended."),
    (stop_by_eviction, StopReason.HOST_EVICTED, "Rack move", "The operator's reason: Rack move"),
]


@pytest.mark.parametrize(("stop", "reason", "note", "sentence"), STOPS, ids=[s[1] for s in STOPS])
def test_each_stop_records_its_reason_and_the_owner_reads_why(
    stop, reason, note, sentence, running, alice, olivia, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        stop(running, olivia)

    running.refresh_from_db()
    assert (running.state, running.stop_reason, running.stop_note) == (Instance.State.STOPPED, reason, note)
    owner = Client()
    owner.force_login(alice)
    page = owner.get(reverse("instances:detail", args=[running.id])).content.decode()
    status = owner.get(reverse("instances:status", args=[running.id])).json()
    assert escape(sentence) in page
    assert sentence in status["stop_reason"]


def test_a_deleted_accounts_instance_says_why_it_stopped(running, alice, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        account_delete(user=alice)

    running.refresh_from_db()
    assert (running.state, running.stop_reason) == (Instance.State.STOPPED, StopReason.ACCOUNT_DELETED)
    assert stop_reason_text(running) == "It was stopped because the account was deleted."


def test_an_unknown_reason_is_refused_and_stops_nothing(running):
    with pytest.raises(ValueError, match="Unknown stop reason"):
        services.instance_request_stop(instance_id=running.id, reason="credits exhausted")

    running.refresh_from_db()
    assert running.state == Instance.State.RUNNING
