"""The owners' view of what the pool paid for: by member and by day, from the pool's usage entries, which
name their instance (and so who launched it)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.credits import metering
from portal.instances.models import Instance
from portal.projects import selectors
from tests.conftest import give

from .conftest import fund

pytestmark = pytest.mark.usefixtures("cloud", "meter_ticks_every_minute")


def running(user, image, project, *, minutes_ago, size="1x"):
    since = timezone.now() - timedelta(minutes=minutes_ago)
    return Instance.objects.create(
        user=user, project=project, size=size, image=image, driver="fake",
        state="running", step="ready", ready_at=since, metered_until=since,
    )  # fmt: skip


def test_it_adds_up_the_pools_usage_by_member_and_by_day(vllm, alice, bob, cpu):
    fund(vllm, 10)
    give(bob, 10)
    running(alice, cpu, vllm, minutes_ago=2)
    running(bob, cpu, vllm, minutes_ago=1)
    running(bob, cpu, None, minutes_ago=5)  # his own: not the project's

    metering.meter_tick()
    usage = selectors.project_usage(vllm)

    by_member = {email: spent for _, email, spent in usage.by_member}
    assert set(by_member) == {"alice@example.com", "bob@example.com"}
    assert 119 <= by_member["alice@example.com"] <= 121 and 59 <= by_member["bob@example.com"] <= 61
    assert usage.by_day == [(timezone.now().date(), usage.total)]
    assert usage.total == sum(by_member.values())
    assert usage.by_member[0][1] == "alice@example.com"  # most first


def test_it_shows_nothing_of_another_projects_usage(vllm, triton, dave, cpu):
    fund(triton, 10)
    running(dave, cpu, triton, minutes_ago=2)
    metering.meter_tick()
    assert selectors.project_usage(vllm).by_member == []
    assert selectors.project_usage(triton).total > 0
