"""GET /api/v1/instances/<id> of a waiting launch: its place in the fair-share queue, why it is there, and
when it will likely start with the basis in words; none of it once it is no longer queued."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from portal.instances import services
from portal.instances.models import Instance, LaunchPolicy
from provisioning import scheduler
from provisioning.drivers import fake
from tests.conftest import give

from .conftest import token_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy_host(bob, cpu):
    """gpu-07, whose eight GPUs bob's 8x holds; its 4-hour limit ends in an hour."""
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"], max_session_hours={"1x": 4, "8x": 4})
    give(bob, 100)
    fake.make_host("gpu-07", gpus=8)
    holder = Instance.objects.create(user=bob, size="8x", image=cpu, state=Instance.State.QUEUED)
    assert scheduler.allocate(instance_id=holder.pk)
    ready_at = timezone.now() - timedelta(hours=3)
    Instance.objects.filter(pk=holder.pk).update(
        state=Instance.State.RUNNING, ready_at=ready_at, metered_until=ready_at
    )
    return holder


def test_a_queued_launch_says_where_it_stands_why_and_when_it_starts(alice, busy_host):
    give(alice, 25)
    waiting = services.instance_launch(user=alice, size="1x", image_key="cpu")
    _, api = token_for(alice, scope="read")

    body = api.get(f"/api/v1/instances/{waiting.id}").json()

    assert body["queue_position"] == 1
    assert body["queue_reason"] == (
        "1st in line: you used 0.0 GPU-hours in the last 7 days with share 1. "
        "It starts as soon as GPUs it fits on free up."
    )
    starts = datetime.fromisoformat(body["estimated_start_at"])
    assert timedelta(minutes=59) < starts - timezone.now() <= timedelta(hours=1)
    assert body["estimated_start_basis"].startswith("about 1 h 00 min (by ") or body[
        "estimated_start_basis"
    ].startswith("about 60 min (by ")
    assert (
        f"no launch is ahead of you; the 8x on gpu-07 ends by {starts:%H:%M} UTC at its maximum length."
        in (body["estimated_start_basis"])
    )
    assert [row["queue_position"] for row in api.get("/api/v1/instances").json()] == [1]


def test_a_running_instance_has_no_queue_fields(bob, busy_host):
    _, api = token_for(bob, scope="read")

    body = api.get(f"/api/v1/instances/{busy_host.id}").json()

    assert (body["queue_position"], body["queue_reason"]) == (None, "")
    assert (body["estimated_start_at"], body["estimated_start_basis"]) == (None, "")
