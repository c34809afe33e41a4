"""The notifications fire where the events happen: the meter tick (credit warnings, stops for exhausted
credits) and the provisioning lifecycle (failed launches), each once however often the code runs."""

import secrets
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.instances import lifecycle
from portal.instances.models import Instance
from portal.notifications.models import Kind, Notification
from provisioning.drivers import fake
from tests.conftest import give, mails_to

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cloud", "meter_ticks_every_minute")]

T0 = timezone.now().replace(microsecond=0) - timedelta(days=1)
ONE_HOUR_LEFT = "About 1 hour of GPU credit left on DevCloud"
TEN_MINUTES_LEFT = "About 10 minutes of GPU credit left: your instances stop soon"


@pytest.fixture
def cpu(db):
    return fake.make_image("cpu", name="CPU JupyterLab")


@pytest.fixture
def running(cpu):
    """Factory: an instance of `user` that turned ready at T0 and has been charged up to T0."""

    def make(user, size="1x"):
        return Instance.objects.create(
            user=user,
            size=size,
            image=cpu,
            driver="fake",
            state=Instance.State.RUNNING,
            step=Instance.Step.READY,
            ready_at=T0,
            metered_until=T0,
        )

    return make


@pytest.fixture
def tick(django_capture_on_commit_callbacks):
    """One beat of the meter at T0 + `seconds`, with what it commits (emails, teardowns) carried out."""

    def run(seconds):
        with django_capture_on_commit_callbacks(execute=True):
            return lifecycle.meter_tick(T0 + timedelta(seconds=seconds))

    return run


def subjects(mailoutbox, user):
    return [message.subject for message in mails_to(mailoutbox, user)]


def test_the_meter_tick_that_leaves_an_hour_of_credit_sends_the_1_hour_warning_once(
    alice, bob, running, tick, mailoutbox
):
    give(alice, 61 / 60)  # 61 minutes of one GPU
    give(bob, 25)
    running(alice)
    running(bob)

    tick(30)
    assert mailoutbox == []

    tick(60)  # alice: 60 minutes left at one GPU
    tick(120)
    tick(180)

    assert subjects(mailoutbox, alice) == [ONE_HOUR_LEFT]
    assert subjects(mailoutbox, bob) == []


def test_the_meter_tick_warns_at_the_burn_of_all_the_owners_running_gpus(alice, running, tick, mailoutbox):
    give(alice, 1)  # 1 GPU-hour: 7.5 minutes at 8 GPUs
    running(alice, "8x")

    tick(60)  # 6.5 minutes left at 8 GPUs: straight to the 10-minute warning
    tick(120)

    assert subjects(mailoutbox, alice) == [TEN_MINUTES_LEFT]


def test_running_out_of_credit_sends_one_stopped_email_per_instance(alice, running, cpu, tick, mailoutbox):
    give(alice, 30 / 3600)  # 30 GPU-seconds
    started = running(alice)
    waiting = Instance.objects.create(user=alice, size="1x", image=cpu, driver="fake")

    result = tick(60)
    tick(120)
    tick(180)

    assert result.stopping_ids == [started.id] and result.stopped_queued_ids == [waiting.id]
    assert Instance.objects.get(pk=started.pk).state == Instance.State.STOPPED
    stopped = Notification.objects.filter(user=alice, kind=Kind.INSTANCE_STOPPED)
    assert sorted(n.context["instance_id"] for n in stopped) == sorted([str(started.id), str(waiting.id)])
    assert {n.context["reason"] for n in stopped} == {"credits_exhausted"}
    assert sorted(subjects(mailoutbox, alice)) == sorted(
        f"Your instance {instance.short_id} (1x MI300X, CPU JupyterLab) was stopped: your credits ran out"
        for instance in (started, waiting)
    )


@pytest.fixture
def queued(alice, cpu, db):
    fake.make_host("gpu-01", gpus=8)
    give(alice, 25)
    return Instance.objects.create(
        user=alice, size="1x", image=cpu, driver="fake", jupyter_token=secrets.token_hex(24)
    )


def test_a_failed_launch_sends_one_launch_failed_email(
    alice, queued, cloud, mailoutbox, django_capture_on_commit_callbacks
):
    cloud.behave(permanent_start_error="Image devcloud/cpu:test is not on this host.")

    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.instance_provision(instance_id=queued.id) == "failed"
        # A late duplicate (the task's retry giving up, or the reconciler) finds it failed already.
        assert lifecycle.instance_fail(instance_id=queued.id, reason="Timed out.") is False
        assert lifecycle.instance_provision(instance_id=queued.id, resume=True) == "skipped"

    (message,) = mails_to(mailoutbox, alice)
    assert message.subject == f"Your launch of {queued.short_id} (1x MI300X, CPU JupyterLab) failed"
    assert "Image devcloud/cpu:test is not on this host. Nothing was charged." in message.body


def test_a_running_instance_whose_container_vanished_is_not_reported_as_a_failed_launch(
    alice, queued, cloud, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.instance_provision(instance_id=queued.id) == "running"
        cloud.remove_container(queued.id)
        assert lifecycle.reconcile().vanished_failed == 1

    assert Instance.objects.get(pk=queued.pk).state == Instance.State.FAILED
    assert not Notification.objects.filter(user=alice, kind=Kind.LAUNCH_FAILED).exists()
