"""Inside the window only the booker launches on the booked GPUs, and at once: named or matched by
itself, with no credit check (the credit is held), stopped at the window's end."""

import pytest
from django.core.exceptions import ValidationError
from django.http import Http404

from portal.instances import services
from portal.instances.models import Instance
from tests.conftest import give

from .conftest import book, launch, open_now


@pytest.fixture
def alices_host(alice, fleet):
    give(alice, 40)
    return open_now(book(alice, gpus=8, start_in=2, hours=2))


def test_only_the_booker_can_launch_inside_the_window(alice, bob, fleet, alices_host):
    give(bob, 100)

    others = launch(bob, "1x", stop_after_seconds=600)  # short, and still kept off the booked host
    with pytest.raises(Http404):
        services.instance_launch(user=bob, size="1x", image_key="cpu", reservation=alices_host.id)
    mine = launch(alice, "8x", reservation=alices_host.id)

    assert others.state == Instance.State.QUEUED and others.reservation is None
    assert mine.state == Instance.State.RUNNING and mine.host == fleet
    assert mine.deadline_at == alices_host.ends_at


def test_a_launch_in_the_window_is_matched_to_the_booking_and_skips_the_queue(alice, bob, fleet, alices_host):
    give(bob, 100)
    waiting = launch(bob, "1x")  # queued first, for a host it may not have
    assert waiting.state == Instance.State.QUEUED

    mine = launch(alice, "1x")

    assert mine.reservation == alices_host and mine.state == Instance.State.RUNNING


def test_the_held_credit_pays_for_the_launch(bob, fleet):
    give(bob, 32)
    booking = open_now(book(bob, gpus=8, start_in=2, hours=2))  # all 32 GPU-hours held: none to spare

    mine = launch(bob, "8x")

    assert mine.state == Instance.State.RUNNING and mine.reservation == booking


def test_a_named_booking_refuses_a_launch_it_has_no_room_for(alice, fleet, alices_host):
    launch(alice, "8x", reservation=alices_host.id)

    with pytest.raises(ValidationError) as caught:
        services.instance_launch(user=alice, size="1x", image_key="cpu", reservation=alices_host.id)

    assert caught.value.code == "booking" and "8 in use" in caught.value.messages[0]


def test_a_named_booking_refuses_a_launch_before_its_window(alice, fleet):
    give(alice, 40)
    later = book(alice, gpus=8, start_in=2, hours=2)

    with pytest.raises(ValidationError) as caught:
        services.instance_launch(user=alice, size="8x", image_key="cpu", reservation=later.id)

    assert caught.value.code == "booking" and "opens at" in caught.value.messages[0]
