"""Sessions the owner can extend: the limits beat warns before a session's time limit ends (once per end),
the owner adds hours up to a ceiling while the paying account's credit covers them, and the beat stops
at the new end. The API's and the CLI's paths are in tests/api and tests/cli."""

import re
import uuid
from datetime import datetime, timedelta

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.db import connection
from django.http import Http404
from django.urls import reverse
from django.utils import timezone

from portal.credits import services as credits
from portal.credits.models import CreditAccount, LedgerEntry
from portal.credits.services import ledger_post
from portal.instances import lifecycle, limits, selectors, services, sessions, tasks
from portal.instances.models import Instance, InstanceEvent, LaunchPolicy
from portal.notifications.models import Kind, Notification
from portal.projects import services as projects
from portal.projects.models import Project
from provisioning.drivers import fake
from tests.conftest import give, make_user, text
from tests.support.race import at_once

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600


@pytest.fixture(autouse=True)
def tasks_run_inline():
    """As in test_max_length.py: teardowns and emails run inline whatever an earlier test left behind."""
    from portal.celery import app

    saved = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = saved


@pytest.fixture
def cpu(db, settings):
    settings.SESSION_END_WARNING_MINUTES = 30
    settings.SESSION_MAX_EXTENSION_HOURS = 8
    settings.LAUNCH_MIN_CREDIT_MINUTES = 15
    fake.make_host("gpu-01", gpus=8)
    image = fake.make_image("cpu", sizes=["1x", "8x"])
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"], max_session_hours={"1x": 12, "8x": 4})
    return image


def running(user, size="1x", *, ready_hours_ago, credit_hours=200, project=None):
    """A running instance of `user` that turned ready `ready_hours_ago` hours ago, `credit_hours` granted."""
    if credit_hours and project is None:
        credits.credits_adjust(
            user=user, gpu_seconds=int(credit_hours * HOUR), reason="Test", actor=None,
            idempotency_key=str(uuid.uuid4()),
        )
    instance = services.instance_launch(user=user, size=size, image_key="cpu", project=project)
    lifecycle.instance_provision(instance_id=instance.id)  # "skipped" when its launch's commit ran it
    ready_at = timezone.now() - timedelta(hours=ready_hours_ago)
    Instance.objects.filter(pk=instance.pk).update(ready_at=ready_at, metered_until=timezone.now())
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    return instance


def warnings_of(user):
    return Notification.objects.filter(user=user, kind=Kind.SESSION_ENDING)


# --- The warning ------------------------------------------------------------------------------------


def test_it_warns_once_inside_the_window_and_not_before(alice, cpu, django_capture_on_commit_callbacks):
    instance = running(alice, ready_hours_ago=11)  # 60 minutes left of 12 hours: outside the 30

    assert limits.warn_sessions_ending() == []
    Instance.objects.filter(pk=instance.pk).update(ready_at=timezone.now() - timedelta(hours=11, minutes=40))
    with django_capture_on_commit_callbacks(execute=True):
        first = limits.warn_sessions_ending()
    with django_capture_on_commit_callbacks(execute=True):
        second = limits.warn_sessions_ending()

    assert first == [str(instance.id)] and second == []
    assert warnings_of(alice).count() == 1
    assert len(mail.outbox) == 1
    assert "reaches its time limit in 20 minutes" in mail.outbox[0].subject
    assert "devcloud extend" in mail.outbox[0].body
    assert f"/instances/{instance.id}/" in mail.outbox[0].body


def test_the_beat_task_warns(alice, cpu):
    running(alice, ready_hours_ago=11.75)

    assert tasks.enforce_limits.apply().get() == 0
    assert warnings_of(alice).count() == 1


def test_no_warning_when_the_setting_is_zero_or_the_size_has_no_limit(alice, cpu, settings):
    running(alice, ready_hours_ago=11.75)
    settings.SESSION_END_WARNING_MINUTES = 0
    assert limits.warn_sessions_ending() == []

    settings.SESSION_END_WARNING_MINUTES = 30
    LaunchPolicy.objects.update(max_session_hours={"1x": 0, "8x": 4})
    assert limits.warn_sessions_ending() == []


def test_it_warns_again_after_an_extension(alice, cpu):
    instance = running(alice, ready_hours_ago=11.75)
    assert limits.warn_sessions_ending() == [str(instance.id)]

    services.instance_extend(user=alice, instance_id=instance.id, hours=1)
    assert limits.warn_sessions_ending() == []  # the new end is 75 minutes away

    Instance.objects.filter(pk=instance.pk).update(ready_at=timezone.now() - timedelta(hours=12, minutes=45))
    assert limits.warn_sessions_ending() == [str(instance.id)]
    assert limits.warn_sessions_ending() == []
    assert warnings_of(alice).count() == 2


# --- Extending --------------------------------------------------------------------------------------


def test_an_extension_moves_the_stop_and_goes_on_the_timeline(alice, cpu):
    instance = running(alice, ready_hours_ago=12.5)  # past its 12 hours

    extended = services.instance_extend(user=alice, instance_id=instance.id, hours=2)

    assert extended.extended_seconds == 2 * HOUR
    assert limits.enforce_max_session_length() == []
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    events = InstanceEvent.objects.filter(instance=instance)
    assert events.filter(message__startswith="Session extended by 2 hours by its owner").exists()
    assert sessions.session_end(instance, LaunchPolicy.current()) == instance.ready_at + timedelta(hours=14)

    Instance.objects.filter(pk=instance.pk).update(ready_at=timezone.now() - timedelta(hours=14, minutes=1))
    assert limits.enforce_max_session_length() == [str(instance.id)]
    instance.refresh_from_db()
    assert instance.stop_reason == "max_length"
    assert "the 2 hours added to it" in instance.events.last().message


def test_extensions_add_up_to_the_ceiling_and_no_further(alice, cpu):
    instance = running(alice, ready_hours_ago=1)
    services.instance_extend(user=alice, instance_id=instance.id, hours=5)
    services.instance_extend(user=alice, instance_id=instance.id, hours=3)

    with pytest.raises(ValidationError) as refused:
        services.instance_extend(user=alice, instance_id=instance.id, hours=1)

    assert refused.value.code == "ceiling"
    assert "at most 8 hours in all; this one has 8 already, so at most 0 more" in refused.value.messages[0]
    instance.refresh_from_db()
    assert instance.extended_seconds == 8 * HOUR


def test_a_ceiling_of_zero_turns_extending_off(alice, cpu, settings):
    instance = running(alice, ready_hours_ago=1)
    settings.SESSION_MAX_EXTENSION_HOURS = 0

    with pytest.raises(ValidationError) as refused:
        services.instance_extend(user=alice, instance_id=instance.id, hours=1)

    assert refused.value.code == "ceiling"


def test_it_refuses_without_the_credit_and_says_how_much_is_needed_and_available(alice, cpu):
    # 3 GPU-hours: the launch window's 15 minutes leave 2.75, short of 3 hours on 1x.
    instance = running(alice, ready_hours_ago=1, credit_hours=3)

    with pytest.raises(ValidationError) as refused:
        services.instance_extend(user=alice, instance_id=instance.id, hours=3)

    assert refused.value.code == "credit"
    message = refused.value.messages[0]
    assert "need 3.00 GPU-hours" in message and "you have 2.75 GPU-hours" in message
    services.instance_extend(user=alice, instance_id=instance.id, hours=2)  # 2 of the 2.75 are there
    with pytest.raises(ValidationError, match="you have 0.75 GPU-hours"):
        services.instance_extend(user=alice, instance_id=instance.id, hours=1)  # the 2 granted are spoken for


def test_a_project_instance_is_extended_from_the_pool_not_the_owners_credit(alice, cpu):
    project = projects.project_create(user=alice, slug="lab", name="Lab")
    Project.objects.filter(pk=project.pk).update(max_run_seconds=4 * HOUR, max_live_instances=5)
    ledger_post(
        account=CreditAccount.objects.get(project=project), kind=LedgerEntry.Kind.GRANT,
        gpu_seconds=int(1.5 * HOUR), idempotency_key="test-fund:lab", reason="Test grant to the project",
    )
    give(alice, 100)  # her own credit does not pay for the project's instance
    instance = running(alice, ready_hours_ago=3.75, project=project)
    assert selectors.session_status(instance).ending_soon

    with pytest.raises(ValidationError, match="the project Lab's pool has 1.25 GPU-hours") as refused:
        services.instance_extend(user=alice, instance_id=instance.id, hours=2)
    assert refused.value.code == "credit"
    services.instance_extend(user=alice, instance_id=instance.id, hours=1)
    assert limits.enforce_max_session_length() == []  # past the project's 4 hours, inside the hour added


def test_only_a_running_instance_is_extended(alice, cpu):
    instance = running(alice, ready_hours_ago=1)
    services.instance_stop(user=alice, instance_id=instance.id)

    with pytest.raises(ValidationError, match="Only a running instance") as refused:
        services.instance_extend(user=alice, instance_id=instance.id, hours=1)
    assert refused.value.code == "ended"


def test_another_person_cannot_extend(alice, bob, cpu):
    instance = running(alice, ready_hours_ago=1)

    with pytest.raises(Http404):
        services.instance_extend(user=bob, instance_id=instance.id, hours=1)
    instance.refresh_from_db()
    assert instance.extended_seconds == 0


def test_a_run_deadline_is_not_moved(alice, cpu):
    instance = running(alice, ready_hours_ago=1)
    deadline = timezone.now() + timedelta(minutes=10)
    Instance.objects.filter(pk=instance.pk).update(deadline_at=deadline)

    instance = services.instance_extend(user=alice, instance_id=instance.id, hours=2)

    instance.refresh_from_db()
    assert instance.deadline_at == deadline
    assert sessions.stops_at(instance, LaunchPolicy.current()) == deadline


@pytest.mark.django_db(transaction=True)
def test_two_extensions_racing_for_the_last_credit_cannot_both_pass(settings):
    settings.SESSION_MAX_EXTENSION_HOURS = 8
    settings.LAUNCH_MIN_CREDIT_MINUTES = 15
    fake.make_host("gpu-01", gpus=8)
    fake.make_image("cpu", sizes=["1x", "8x"])
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"], max_session_hours={"1x": 12, "8x": 4})
    carol = make_user("carol@example.com")
    # Two running 1x instances hold 0.5 GPU-hours of launch window; 3 more cover one 2-hour extension.
    first = running(carol, ready_hours_ago=1, credit_hours=3.5)
    second = running(carol, ready_hours_ago=1, credit_hours=0)
    targets = iter([first.id, second.id])

    def extend():
        instance_id = next(targets)
        try:
            services.instance_extend(user=carol, instance_id=instance_id, hours=2)
            return "extended"
        except ValidationError as error:
            return error.code
        finally:
            connection.close()

    results, errors = at_once(extend)

    assert errors == []
    assert sorted(results) == ["credit", "extended"]
    assert sum(Instance.objects.filter(user=carol).values_list("extended_seconds", flat=True)) == 2 * HOUR


# --- The instance page ------------------------------------------------------------------------------


def test_the_page_shows_the_time_left_and_extends(alice, alice_client, cpu):
    instance = running(alice, ready_hours_ago=11.75)

    page = text(alice_client.get(reverse("instances:detail", args=[instance.id])))
    assert "Its time limit stops it at" in page and re.search(r"1[45] min left", page)
    assert "Extend" in page and "up to 8 more" in page

    response = alice_client.post(reverse("instances:extend", args=[instance.id]), {"hours": 2}, follow=True)
    assert "Extended by 2 hours." in text(response)
    instance.refresh_from_db()
    assert instance.extended_seconds == 2 * HOUR
    assert "up to 6 more" in text(response)


def test_the_page_says_why_an_extension_was_refused(alice, alice_client, cpu, settings):
    instance = running(alice, ready_hours_ago=1)
    settings.SESSION_MAX_EXTENSION_HOURS = 1

    response = alice_client.post(reverse("instances:extend", args=[instance.id]), {"hours": 2}, follow=True)

    assert "at most 1 hours in all" in text(response)


def test_another_person_cannot_extend_from_the_page(alice, bob_client, cpu):
    instance = running(alice, ready_hours_ago=1)

    response = bob_client.post(reverse("instances:extend", args=[instance.id]), {"hours": 1})

    assert response.status_code == 404
    instance.refresh_from_db()
    assert instance.extended_seconds == 0


def test_the_page_keeps_the_time_left_current_as_it_polls(alice, alice_client, cpu):
    instance = running(alice, ready_hours_ago=11.75)
    status_url = reverse("instances:status", args=[instance.id])

    near_the_end = alice_client.get(status_url).json()["session"]
    services.instance_extend(user=alice, instance_id=instance.id, hours=2)
    after_extending = alice_client.get(status_url).json()["session"]

    assert near_the_end["ending_soon"] and re.fullmatch(r"1[45] min", near_the_end["time_left"])
    assert not after_extending["ending_soon"] and after_extending["time_left"].startswith("2 h 1")
    ends_at = datetime.fromisoformat(after_extending["ends_at"])
    assert ends_at == instance.ready_at + timedelta(hours=14)
    assert after_extending["ends_at_text"] == ends_at.strftime("%Y-%m-%d %H:%M")


def test_a_page_opened_before_the_instance_ran_can_show_its_time_left_once_it_runs(alice, alice_client, cpu):
    give(alice, 10)
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")

    page = alice_client.get(reverse("instances:detail", args=[instance.id])).content.decode()
    status = alice_client.get(reverse("instances:status", args=[instance.id])).json()

    # The line and its Extend form are on the page, hidden until the polled status gives an end.
    assert re.search(r'<div id="session-end" data-testid="session-end"\s+hidden>', page)
    assert 'data-testid="extend-form"' in page
    assert status["session"]["ends_at"] is None
