"""`devcloud extend` and the TIME LEFT column of `devcloud ls`, against the live portal."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.cli.main import _time_left
from portal.instances.models import Instance, LaunchPolicy

from .test_cli import OK, REFUSED, logged_in  # noqa: F401  (logged_in is a fixture, used by name)

HOUR = 3600


@pytest.fixture
def running(logged_in, alice, settings):  # noqa: F811
    settings.SESSION_MAX_EXTENSION_HOURS = 8
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"], max_session_hours={"1x": 12, "8x": 4})
    assert logged_in("launch", "--size", "1x", "--image", "cpu", "--wait").returncode == OK
    instance = Instance.objects.get(user=alice)
    Instance.objects.filter(pk=instance.pk).update(ready_at=timezone.now() - timedelta(hours=11, minutes=30))
    instance.refresh_from_db()
    return instance


def test_ls_shows_the_time_left_and_extend_adds_hours(logged_in, running):  # noqa: F811
    listed = logged_in("ls")
    assert "TIME LEFT" in listed.stdout
    row = next(line for line in listed.stdout.splitlines() if running.short_id in line)
    assert row.rstrip().endswith(("29m", "30m"))

    extended = logged_in("extend", running.short_id, "--hours", "2")
    assert extended.returncode == OK, extended.stderr
    assert f"{running.short_id} extended by 2 hours; it now stops at" in extended.stdout
    running.refresh_from_db()
    assert running.extended_seconds == 2 * HOUR
    row = next(line for line in logged_in("ls").stdout.splitlines() if running.short_id in line)
    assert row.rstrip().endswith(("2h29m", "2h30m"))
    assert json.loads(logged_in("ls", "--json").stdout)[0]["session_ends_at"]


def test_extend_past_the_ceiling_is_refused_with_the_reason(logged_in, running):  # noqa: F811
    refused = logged_in("extend", running.short_id, "--hours", "9")
    assert refused.returncode == REFUSED
    assert "at most 8 hours in all" in refused.stderr


def test_time_left_reads_nothing_as_a_dash():
    now = timezone.now()
    assert _time_left(None) == "-"
    assert _time_left((now + timedelta(minutes=90, seconds=5)).isoformat(), now) == "1h30m"
    assert _time_left((now - timedelta(minutes=5)).isoformat(), now) == "0m"
