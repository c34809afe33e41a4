"""A launch's own deadline (`devcloud run --timeout`, the API's stop_after_seconds): the limits beat stops
the instance at that time whatever became of the client, queued or running, bills it only up to the stop,
and leaves instances without a deadline, or before it, alone."""

import uuid
from datetime import timedelta

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.credits import services as credits
from portal.instances import lifecycle, limits, services, tasks
from portal.instances.models import Instance
from portal.instances.selectors import stop_reason_text
from provisioning.drivers import fake

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600


@pytest.fixture(autouse=True)
def tasks_run_inline():
    from portal.celery import app

    saved = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = saved


@pytest.fixture
def rich_alice(alice, db):
    fake.make_host("gpu-01", gpus=8)
    fake.make_image("cpu", sizes=["1x", "8x"])
    credits.credits_adjust(
        user=alice, gpu_seconds=200 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    return alice


def launch(user, **options) -> Instance:
    instance = services.instance_launch(user=user, size="1x", image_key="cpu", **options)
    instance.refresh_from_db()
    return instance


def test_a_launch_with_stop_after_seconds_gets_its_deadline(rich_alice):
    before = timezone.now()
    instance = launch(rich_alice, stop_after_seconds=1800)

    assert (
        before + timedelta(seconds=1800) <= instance.deadline_at <= timezone.now() + timedelta(seconds=1800)
    )


@pytest.mark.parametrize("seconds", [0, 59, 7 * 24 * 3600 + 1, -5])
def test_a_deadline_outside_a_minute_to_a_week_is_refused_and_nothing_is_queued(rich_alice, seconds):
    with pytest.raises(ValidationError) as refused:
        launch(rich_alice, stop_after_seconds=seconds)

    assert "between 60 (a minute) and 604800 (a week)" in refused.value.messages[0]
    assert not Instance.objects.exists()


def test_the_beat_stops_a_running_instance_past_its_deadline_and_only_it(rich_alice):
    timed = launch(rich_alice, stop_after_seconds=600)
    untimed = launch(rich_alice)
    later = launch(rich_alice, stop_after_seconds=3600)
    for instance in (timed, untimed, later):
        assert lifecycle.instance_provision(instance_id=instance.id) == "running"

    stopped = limits.enforce_deadlines(now=timezone.now() + timedelta(seconds=601))

    assert stopped == [str(timed.id)]
    states = dict(Instance.objects.values_list("id", "state"))
    assert states[timed.id] == Instance.State.STOPPING  # its teardown is enqueued when the stop commits
    assert states[untimed.id] == states[later.id] == Instance.State.RUNNING
    timed.refresh_from_db()
    assert timed.stop_reason == "deadline"
    assert "time limit its launch set" in stop_reason_text(timed)
    assert mail.outbox == []  # the client that set the deadline reports it; no email per CI run


def test_a_run_that_never_started_is_stopped_at_its_deadline_too(rich_alice):
    queued = launch(rich_alice, stop_after_seconds=60)
    Instance.objects.filter(pk=queued.pk).update(state=Instance.State.QUEUED)

    assert limits.enforce_deadlines(now=timezone.now() + timedelta(seconds=61)) == [str(queued.id)]
    queued.refresh_from_db()
    assert queued.state == Instance.State.STOPPED and queued.stop_reason == "deadline"


def test_the_limits_beat_task_enforces_deadlines(rich_alice):
    instance = launch(rich_alice, stop_after_seconds=60)
    lifecycle.instance_provision(instance_id=instance.id)
    Instance.objects.filter(pk=instance.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))

    assert tasks.enforce_limits.apply().get() == 1
    instance.refresh_from_db()
    assert instance.stop_reason == "deadline"
