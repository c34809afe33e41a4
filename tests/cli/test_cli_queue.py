"""`devcloud ls` shows a waiting launch's place and estimated start, and the estimate's basis in words,
against the live portal."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from portal.cli.main import _starts
from portal.instances.models import Instance, LaunchPolicy
from provisioning import scheduler
from tests.conftest import give

from .test_cli import OK, logged_in  # noqa: F401  (logged_in is a fixture, used by name)


@pytest.fixture
def busy(portal, bob):
    """Bob's 8x holds all of gpu-01's GPUs; its 4-hour limit ends in 90 minutes."""
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"], max_session_hours={"1x": 4, "8x": 4})
    give(bob, 100)
    image = Instance._meta.get_field("image").related_model.objects.get(key="cpu")
    holder = Instance.objects.create(user=bob, size="8x", image=image, state=Instance.State.QUEUED)
    assert scheduler.allocate(instance_id=holder.pk)
    ready_at = timezone.now() - timedelta(hours=2, minutes=30)
    Instance.objects.filter(pk=holder.pk).update(
        state=Instance.State.RUNNING, ready_at=ready_at, metered_until=ready_at
    )
    return holder


def test_ls_shows_where_a_waiting_launch_stands_and_when_it_starts(logged_in, busy):  # noqa: F811
    launched = logged_in("launch", "--size", "1x", "--image", "cpu")
    assert launched.returncode == OK, launched.stderr
    waiting = Instance.objects.get(user__email="alice@example.com")
    assert waiting.state == Instance.State.QUEUED

    listed = logged_in("ls")

    assert "STARTS" in listed.stdout
    row = next(line for line in listed.stdout.splitlines() if line.startswith(waiting.short_id))
    assert "#1 ~1h29m" in row or "#1 ~1h30m" in row
    assert f"{waiting.short_id}: about 1 h 30 min (by " in listed.stdout
    assert "the 8x on gpu-01 ends by" in listed.stdout and "at its maximum length." in listed.stdout


def test_starts_reads_a_place_without_an_estimate_as_a_question_mark():
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    assert _starts({"queue_position": None}) == "-"
    assert _starts({"queue_position": 3, "estimated_start_at": None}) == "#3 ?"
    assert _starts({"queue_position": 2, "estimated_start_at": "2026-12-04T12:40:00+00:00"}, now) == "#2 ~40m"
    assert (
        _starts({"queue_position": 1, "estimated_start_at": "2026-12-04T14:05:00+00:00"}, now) == "#1 ~2h05m"
    )
