"""POST /api/v1/instances/<id>/extend and the session_ends_at field: the owner adds hours to a running
session through instance_extend; refusals come back as problems (402 credit, 409 ceiling or ended)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.instances import services
from portal.instances.models import Instance, LaunchPolicy
from tests.conftest import give

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db

HOUR = 3600


@pytest.fixture
def running(alice, cpu, settings):
    """alice's 1x instance, ready for 11 hours of its 12."""
    settings.SESSION_MAX_EXTENSION_HOURS = 8
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"], max_session_hours={"1x": 12, "8x": 4})
    give(alice, 25)
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING, step="ready", ready_at=timezone.now() - timedelta(hours=11),
        metered_until=timezone.now(),
    )
    instance.refresh_from_db()
    return instance


def _ends_at(body) -> timezone.datetime:
    return timezone.datetime.fromisoformat(body["session_ends_at"].replace("Z", "+00:00"))


def test_session_ends_at_says_when_the_limits_stop_it(alice, running):
    _, api = token_for(alice, scope="read")
    body = api.get(f"/api/v1/instances/{running.id}").json()
    assert _ends_at(body) == running.ready_at + timedelta(hours=12)
    assert body["extended_seconds"] == 0
    assert api.get("/api/v1/instances").json()[0]["session_ends_at"] == body["session_ends_at"]


def test_session_ends_at_is_null_when_nothing_stops_it(alice, running):
    LaunchPolicy.objects.update(max_session_hours={"1x": 0})
    _, api = token_for(alice, scope="read")
    assert api.get(f"/api/v1/instances/{running.id}").json()["session_ends_at"] is None


def test_it_extends_the_session(alice, running):
    _, api = token_for(alice)
    answer = api.post(f"/api/v1/instances/{running.id}/extend", {"hours": 3})
    assert answer.status_code == 200, answer.content
    assert answer.json()["extended_seconds"] == 3 * HOUR
    assert _ends_at(answer.json()) == running.ready_at + timedelta(hours=15)


def test_past_the_ceiling_is_a_409(alice, running):
    _, api = token_for(alice)
    refused = api.post(f"/api/v1/instances/{running.id}/extend", {"hours": 9})
    body = assert_problem(refused, 409, kind="extension-limit")
    assert "at most 8 hours in all" in body["detail"]


def test_without_the_credit_it_is_a_402_that_says_how_much(alice, running):
    give(alice, -20)  # 5 GPU-hours left, 4.75 after the launch window
    _, api = token_for(alice)
    body = assert_problem(
        api.post(f"/api/v1/instances/{running.id}/extend", {"hours": 8}), 402, kind="insufficient-credit"
    )
    assert "need 8.00 GPU-hours" in body["detail"] and "you have 4.75 GPU-hours" in body["detail"]
    give(alice, 100)
    assert api.post(f"/api/v1/instances/{running.id}/extend", {"hours": 8}).status_code == 200


def test_a_stopped_instance_is_a_409(alice, running):
    services.instance_stop(user=alice, instance_id=running.id)
    _, api = token_for(alice)
    refused = api.post(f"/api/v1/instances/{running.id}/extend", {"hours": 1})
    assert_problem(refused, 409, kind="instance-ended")


def test_hours_must_be_a_positive_whole_number(alice, running):
    _, api = token_for(alice)
    assert_problem(api.post(f"/api/v1/instances/{running.id}/extend", {"hours": 0}), 400, kind="validation")
    assert_problem(api.post(f"/api/v1/instances/{running.id}/extend", {}), 400, kind="validation")


def test_another_person_gets_a_404(bob, running):
    _, api = token_for(bob)
    assert_problem(api.post(f"/api/v1/instances/{running.id}/extend", {"hours": 1}), 404)
    running.refresh_from_db()
    assert running.extended_seconds == 0


def test_a_read_scoped_token_cannot_extend(alice, running):
    _, api = token_for(alice, scope="read")
    refused = api.post(f"/api/v1/instances/{running.id}/extend", {"hours": 1})
    assert_problem(refused, 403, kind="insufficient-scope")
