"""The queue's fair share: who used little goes ahead of who used much, operators' shares weigh use, a
launch that waited past the bound goes by age, the 8x rules still hold, and the place and "why" each
person reads agree with the order start_queued hands out GPUs in."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from portal.accounts.models import User
from portal.instances import lifecycle, queue, selectors, transitions
from portal.instances.models import Instance
from provisioning import scheduler
from provisioning.drivers import fake
from provisioning.models import GpuAllocation

HOUR = 3600


@pytest.fixture
def cpu(db):
    return fake.make_image("cpu")


@pytest.fixture
def dave(db):
    return User.objects.create_user("dave@example.com", "pw-dave-012345", email_verified_at=timezone.now())


@pytest.fixture
def provisions(monkeypatch):
    """The provision tasks start_queued publishes, by instance id, instead of running them."""
    published = []

    def record(task, **kwargs):
        published.append(kwargs.get("instance_id"))
        return True

    monkeypatch.setattr(lifecycle, "enqueue", record)
    return published


def used(user, cpu, *, gpu_hours: float, days_ago: float = 2, size="1x"):
    """A stopped instance of `user` that ran `gpu_hours` GPU-hours, ending `days_ago` days ago."""
    gpus = 8 if size == "8x" else 1
    stopped_at = timezone.now() - timedelta(days=days_ago)
    return Instance.objects.create(
        user=user,
        size=size,
        image=cpu,
        state=Instance.State.STOPPED,
        ready_at=stopped_at - timedelta(seconds=gpu_hours * HOUR / gpus),
        stopped_at=stopped_at,
    )


def queued(user, cpu, *, minutes_ago: float, size="1x"):
    """A launch of `user` waiting for GPUs since `minutes_ago` minutes ago (tried once and put back)."""
    instance = Instance.objects.create(user=user, size=size, image=cpu, state=Instance.State.QUEUED)
    created_at = timezone.now() - timedelta(minutes=minutes_ago)
    Instance.objects.filter(pk=instance.pk).update(created_at=created_at, provisioning_at=created_at)
    instance.refresh_from_db()
    return instance


def fill(host, cpu, user, count):
    """`count` running instances of `user` holding GPUs on `host`."""
    holders = []
    for _ in range(count):
        holder = Instance.objects.create(user=user, size="1x", image=cpu, state=Instance.State.QUEUED)
        assert scheduler.allocate(instance_id=holder.pk)
        Instance.objects.filter(pk=holder.pk).update(state=Instance.State.RUNNING, ready_at=timezone.now())
        holders.append(holder)
    return holders


def gets_gpus(instance) -> bool:
    return GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).exists()


def position(instance) -> int | None:
    instance.refresh_from_db()
    return selectors.queue_position(instance)


def test_a_light_user_goes_ahead_of_a_heavy_user_who_queued_earlier(bob, charlie, cpu, provisions):
    host = fake.make_host("gpu-01", gpus=1)
    used(bob, cpu, gpu_hours=12.5)
    heavy = queued(bob, cpu, minutes_ago=30)
    light = queued(charlie, cpu, minutes_ago=5)

    assert (position(light), position(heavy)) == (1, 2)
    assert queue.why_text(queue.place_of(heavy)) == (
        "2nd in line: you used 12.5 GPU-hours in the last 7 days with share 1. "
        "1 launch is ahead: 1 from people who used less for their share."
    )

    assert lifecycle.start_queued() == 1
    assert gets_gpus(light) and not gets_gpus(heavy)
    assert GpuAllocation.objects.get(instance=light).gpu.host == host


def test_use_counts_only_inside_the_window(bob, charlie, cpu, settings):
    settings.FAIR_SHARE_WINDOW_HOURS = 24
    used(bob, cpu, gpu_hours=100, days_ago=2)  # before the window: forgotten
    used(charlie, cpu, gpu_hours=1, days_ago=0.5)
    bobs = queued(bob, cpu, minutes_ago=5)
    charlies = queued(charlie, cpu, minutes_ago=30)

    assert (position(bobs), position(charlies)) == (1, 2)
    assert "you used 1.0 GPU-hours in the last 24 h with share 1" in queue.why_text(queue.place_of(charlies))


def test_an_operators_share_divides_the_use(bob, charlie, cpu):
    used(bob, cpu, gpu_hours=10)
    used(charlie, cpu, gpu_hours=5)
    bobs = queued(bob, cpu, minutes_ago=5)
    charlies = queued(charlie, cpu, minutes_ago=30)
    assert (position(charlies), position(bobs)) == (1, 2)

    # 10 GPU-hours at share 4 weigh 2.5: less than charlie's 5 at share 1.
    User.objects.filter(pk=bob.pk).update(queue_share=Decimal(4))

    assert (position(bobs), position(charlies)) == (1, 2)
    assert queue.why_text(queue.place_of(charlies)).startswith(
        "2nd in line: you used 5.0 GPU-hours in the last 7 days with share 1. 1 launch is ahead: 1 from people"
    )


def test_a_share_must_be_above_zero(bob):
    bob.queue_share = Decimal(0)
    with pytest.raises(ValidationError) as refused:
        bob.full_clean()
    assert "queue_share" in refused.value.message_dict

    with pytest.raises(IntegrityError), transaction.atomic():
        User.objects.filter(pk=bob.pk).update(queue_share=Decimal(-1))


def test_a_heavy_users_launch_past_the_bound_goes_first_by_age(bob, charlie, dave, cpu, settings, provisions):
    settings.FAIR_SHARE_MAX_WAIT_SECONDS = 2 * HOUR
    fake.make_host("gpu-01", gpus=1)
    used(bob, cpu, gpu_hours=100)
    overdue = queued(bob, cpu, minutes_ago=121)
    fresh = [queued(charlie, cpu, minutes_ago=10), queued(dave, cpu, minutes_ago=2)]

    assert [position(i) for i in (overdue, *fresh)] == [1, 2, 3]
    assert queue.why_text(queue.place_of(overdue)).startswith(
        "1st in line: it has waited longer than 2 h, so it goes by age (you used 100.0 GPU-hours"
    )
    assert "1 waited longer than 2 h" in queue.why_text(queue.place_of(fresh[0]))

    assert lifecycle.start_queued() == 1
    assert gets_gpus(overdue) and not any(gets_gpus(i) for i in fresh)


def test_past_the_bound_only_older_launches_stay_ahead(bob, charlie, dave, cpu, settings):
    settings.FAIR_SHARE_MAX_WAIT_SECONDS = HOUR
    used(charlie, cpu, gpu_hours=50)
    used(bob, cpu, gpu_hours=500)
    older = queued(charlie, cpu, minutes_ago=90)
    overdue = queued(bob, cpu, minutes_ago=70)
    # However little the newcomer used, it cannot pass a launch that waited past the bound.
    newcomer = queued(dave, cpu, minutes_ago=0)

    assert [position(i) for i in (older, overdue, newcomer)] == [1, 2, 3]


def test_a_light_users_8x_ahead_keeps_whole_hosts_from_the_1x_behind(bob, charlie, cpu):
    used(bob, cpu, gpu_hours=20)
    heavy_1x = queued(bob, cpu, minutes_ago=30)
    light_8x = queued(charlie, cpu, minutes_ago=1, size="8x")

    plan = scheduler.next_queued(order=queue.queue_order())

    assert [(launch.instance, launch.reserve_whole_hosts) for launch in plan] == [
        (light_8x, False),
        (heavy_1x, True),
    ]


def test_an_8x_that_waited_too_long_still_holds_everything_behind_it(bob, charlie, cpu, settings):
    settings.SCHEDULER_8X_MAX_WAIT_SECONDS = 600
    used(bob, cpu, gpu_hours=20)
    light_8x = queued(charlie, cpu, minutes_ago=11, size="8x")
    queued(bob, cpu, minutes_ago=30)

    plan = scheduler.next_queued(order=queue.queue_order())

    assert [launch.instance for launch in plan] == [light_8x]


def test_the_place_and_why_each_person_reads_are_the_order_start_queued_starts(
    alice, bob, charlie, dave, cpu, provisions
):
    host = fake.make_host("gpu-01", gpus=3)
    holders = fill(host, cpu, alice, 3)
    used(bob, cpu, gpu_hours=30)
    used(charlie, cpu, gpu_hours=3)
    waiting = [
        queued(bob, cpu, minutes_ago=40),
        queued(charlie, cpu, minutes_ago=20),
        queued(dave, cpu, minutes_ago=1),
    ]
    told = {i.pk: (position(i), queue.why_text(queue.place_of(i))) for i in waiting}
    assert told[waiting[2].pk][0] == 1 and told[waiting[1].pk][0] == 2 and told[waiting[0].pk][0] == 3
    assert told[waiting[0].pk][1].endswith(
        "2 launches are ahead: 2 from people who used less for their share."
    )

    started = []
    for holder in holders:
        first = next(i for i in waiting if i not in started and position(i) == 1)
        scheduler.release(instance_id=holder.pk)
        assert lifecycle.start_queued() == 1
        # The one that read "1st in line" is the one that got the GPU; what its task does first: claim it.
        assert gets_gpus(first)
        assert transitions.claim(first.pk, now=timezone.now())
        started.append(first)
        remaining = [i for i in waiting if i not in started]
        assert sorted(position(i) for i in remaining) == list(range(1, len(remaining) + 1))

    assert [told[i.pk][0] for i in started] == [1, 2, 3]
    assert provisions == [str(i.pk) for i in started]


def test_the_instance_page_and_its_status_tell_the_owner_their_place_and_why(bob, charlie, cpu, bob_client):
    fake.make_host("gpu-01", gpus=1)
    used(bob, cpu, gpu_hours=12.5)
    heavy = queued(bob, cpu, minutes_ago=30)
    queued(charlie, cpu, minutes_ago=5)

    page = bob_client.get(reverse("instances:detail", args=[heavy.id])).content.decode()
    status = bob_client.get(reverse("instances:status", args=[heavy.id])).json()

    why = (
        "2nd in line: you used 12.5 GPU-hours in the last 7 days with share 1. "
        "1 launch is ahead: 1 from people who used less for their share."
    )
    assert status["queue_position"] == 2 and status["queue_reason"] == why
    assert "number <strong>2</strong> in the queue" in page
    assert why in page
    assert status["estimate_basis"] and status["estimate_basis"] in page.replace("&#x27;", "'")
