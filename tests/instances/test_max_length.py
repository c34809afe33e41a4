"""Maximum session length: beat stops a running instance that has been ready longer than its size allows,
only that one, bills it up to the stop, and emails its owner once however often it runs."""

import uuid
from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.credits import services as credits
from portal.credits.selectors import balance_for
from portal.instances import lifecycle, limits, services, tasks
from portal.instances.models import Instance, LaunchPolicy
from portal.notifications.models import Notification
from provisioning.drivers import fake

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600


@pytest.fixture(autouse=True)
def tasks_run_inline():
    """Teardowns and emails run inline, as the test settings say. Some earlier tests leave the Celery app
    publishing to a broker instead (they first read its configuration inside
    override_settings(CELERY_TASK_ALWAYS_EAGER=False)), so this file does not rely on the setting."""
    from portal.celery import app

    saved = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = saved


@pytest.fixture
def cpu(db):
    fake.make_host("gpu-01", gpus=8)
    fake.make_host("gpu-02", gpus=8)
    return fake.make_image("cpu", sizes=["1x", "8x"])


@pytest.fixture
def policy(db):
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"], max_session_hours={"1x": 12, "8x": 4})
    return LaunchPolicy.current()


def running(user, size="1x", *, ready_hours_ago):
    """A running instance of `user` that turned ready `ready_hours_ago` hours ago."""
    credits.credits_adjust(
        user=user, gpu_seconds=200 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    instance = services.instance_launch(user=user, size=size, image_key="cpu")
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    ready_at = timezone.now() - timedelta(hours=ready_hours_ago)
    # Not charged since it turned ready, as if the meter had not ticked yet.
    Instance.objects.filter(pk=instance.pk).update(ready_at=ready_at, metered_until=ready_at)
    instance.refresh_from_db()
    return instance


def test_it_stops_the_instance_past_its_limit_and_only_that_one_and_emails_once(
    alice, bob, cpu, policy, cloud, django_capture_on_commit_callbacks
):
    overdue = running(alice, ready_hours_ago=13)
    young = running(bob, ready_hours_ago=11)

    with django_capture_on_commit_callbacks(execute=True):
        first = limits.enforce_max_session_length()
    with django_capture_on_commit_callbacks(execute=True):
        second = limits.enforce_max_session_length()

    assert first == [str(overdue.id)] and second == []
    overdue.refresh_from_db()
    young.refresh_from_db()
    assert (overdue.state, overdue.stop_reason) == (Instance.State.STOPPED, "max_length")
    assert young.state == Instance.State.RUNNING
    assert list(cloud.containers) == [str(young.id)]
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["alice@example.com"]
    assert "reached the maximum session length of 12 hours" in mail.outbox[0].body
    assert Notification.objects.filter(user=bob).count() == 0


def test_each_size_has_its_own_limit(alice, bob, cpu, policy):
    eight = running(alice, "8x", ready_hours_ago=5)
    one = running(bob, "1x", ready_hours_ago=5)

    assert limits.enforce_max_session_length() == [str(eight.id)]
    one.refresh_from_db()
    assert one.state == Instance.State.RUNNING


def test_it_bills_up_to_the_stop(alice, cpu, policy):
    overdue = running(alice, ready_hours_ago=13)

    limits.enforce_max_session_length()

    overdue.refresh_from_db()
    assert overdue.state == Instance.State.STOPPING
    assert 13 * HOUR <= overdue.charged_gpu_seconds < 13 * HOUR + 60
    assert balance_for(alice) == 200 * HOUR - overdue.charged_gpu_seconds


def test_a_size_without_a_limit_runs_on(alice, cpu, policy):
    LaunchPolicy.objects.update(max_session_hours={"1x": 0, "8x": 4})
    instance = running(alice, ready_hours_ago=100)

    assert limits.enforce_max_session_length() == []
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING


def test_it_leaves_a_stop_someone_else_asked_for_to_them(
    alice, cpu, policy, django_capture_on_commit_callbacks
):
    overdue = running(alice, ready_hours_ago=13)
    services.instance_stop(user=alice, instance_id=overdue.id)

    with django_capture_on_commit_callbacks(execute=True):
        assert limits.enforce_max_session_length() == []

    overdue.refresh_from_db()
    assert overdue.stop_reason == "user"
    assert not mail.outbox


def test_the_beat_task_enforces_it(alice, cpu, policy):
    running(alice, ready_hours_ago=13)

    assert tasks.enforce_limits.apply().get() == 1


def test_the_owner_reads_why_on_the_instance_list(alice, cpu, policy):
    running(alice, ready_hours_ago=13)
    limits.enforce_max_session_length()
    browser = Client()
    browser.force_login(alice)

    page = browser.get(reverse("instances:list")).content.decode()

    assert "It reached the longest a session may run at its size and was stopped." in page
