"""The scheduler keeps booked GPUs free as the window nears: nothing is placed on them that could still
run when the window opens (given its session's limit or its deadline), an extension may not carry an
instance into a window, and the window opens on a host that was busy when it was booked."""

import pytest
from django.core.exceptions import ValidationError

from portal.instances import services
from portal.instances.models import Instance, LaunchPolicy
from tests.conftest import give

from .conftest import book, launch, open_now


def test_an_instance_that_would_cross_into_a_window_is_not_placed_there(alice, bob, fleet):
    give(alice, 100)
    give(bob, 100)
    book(bob, gpus=8, start_in=2, hours=2)

    short = launch(alice, "1x", stop_after_seconds=3600)  # stopped an hour from now, clear of it
    crossing = launch(alice, "1x")  # 12-hour sessions: it could still run at the window

    assert crossing.state == Instance.State.QUEUED and crossing.host is None
    assert short.state == Instance.State.RUNNING and short.host == fleet


def test_instances_may_use_the_gpus_a_booking_leaves_free(alice, bob, fleet):
    give(alice, 100)
    give(bob, 100)
    book(bob, gpus=4, start_in=2, hours=2)

    placed = [launch(alice, "1x") for _ in range(4)]
    fifth = launch(alice, "1x")

    assert all(instance.state == Instance.State.RUNNING for instance in placed)
    assert fifth.state == Instance.State.QUEUED


def test_a_window_opens_on_a_busy_host_that_was_kept_free_for_it(
    alice, bob, fleet, django_capture_on_commit_callbacks
):
    LaunchPolicy.objects.update(max_session_hours={"1x": 1, "8x": 4})
    give(alice, 100)
    give(bob, 100)
    busy = launch(alice, "1x")  # runs an hour at most
    assert busy.state == Instance.State.RUNNING

    booking = book(bob, gpus=8, start_in=2, hours=2)  # the host is busy now, free by the window
    LaunchPolicy.objects.update(max_session_hours={"1x": 12, "8x": 4})
    later = launch(alice, "1x")  # would run into the window: kept off the host
    assert later.state == Instance.State.QUEUED

    with django_capture_on_commit_callbacks(execute=True):  # the teardown gives the GPUs back
        services.instance_stop(user=alice, instance_id=busy.id)  # its hour is up
        services.instance_stop(user=alice, instance_id=later.id)
    open_now(booking)
    on_booking = launch(bob, "8x")

    assert on_booking.state == Instance.State.RUNNING
    assert on_booking.host == fleet and on_booking.reservation == booking


def test_an_extension_may_not_carry_an_instance_into_a_window(alice, bob, fleet, settings):
    settings.SESSION_MAX_EXTENSION_HOURS = 8
    LaunchPolicy.objects.update(max_session_hours={"1x": 1, "8x": 4})
    give(alice, 100)
    give(bob, 100)
    running = launch(alice, "1x")
    book(bob, gpus=8, start_in=2, hours=2)

    with pytest.raises(ValidationError) as caught:
        services.instance_extend(user=alice, instance_id=running.id, hours=2)

    assert caught.value.code == "booked" and "booked from" in caught.value.messages[0]
    running.refresh_from_db()
    assert running.extended_seconds == 0
