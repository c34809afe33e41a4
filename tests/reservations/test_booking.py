"""Booking a window: what is refused and why, and the credit held from the balance until the window ends."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.instances import reservations, selectors
from portal.instances.models import Reservation
from tests.conftest import balance, give

from .conftest import book, in_hours

HOUR = 3600


def refusal(user, **kwargs) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        if "starts_at" in kwargs:
            reservations.reservation_book(user=user, **kwargs)
        else:
            book(user, **kwargs)
    return caught.value


def test_it_books_a_whole_host_and_holds_the_windows_credit(alice, fleet):
    give(alice, 20)

    booked = book(alice, gpus=8, start_in=2, hours=2)

    assert booked.host == fleet and booked.state == Reservation.State.BOOKED
    assert booked.hold_gpu_seconds == 16 * HOUR
    assert balance(alice) == 20 * HOUR  # held, not spent
    assert selectors.held_gpu_seconds(user=alice) == 16 * HOUR


def test_held_credit_cannot_be_spent_on_a_launch_or_another_booking(alice, fleet):
    give(alice, 17)
    book(alice, gpus=8, start_in=2, hours=2)  # 16 of 17 GPU-hours held

    options = selectors.launch_options(alice)
    assert options.committed_gpu_seconds == 16 * HOUR
    with pytest.raises(ValidationError) as caught:
        from .conftest import launch

        launch(alice, "8x")  # needs 2 GPU-hours, 1 is free
    assert caught.value.code == "credit"
    assert refusal(alice, gpus=1, start_in=6, hours=2).code == "credit"


@pytest.mark.parametrize(
    "window, code, words",
    [
        ({"start_in": -2, "hours": 1}, "past", "starts in the past"),
        ({"start_in": 1, "hours": 25}, "too_long", "at most 24 hours"),
        ({"start_in": 15 * 24, "hours": 1}, "too_far", "at most 14 days ahead"),
        ({"start_in": 1, "hours": 0.1}, "too_short", "at least 15 minutes"),
        ({"gpus": 9}, "invalid", "between 1 and 8"),
    ],
)
def test_it_refuses_bad_windows_saying_why(alice, fleet, window, code, words):
    give(alice, 500)
    error = refusal(alice, **window)
    assert error.code == code and words in " ".join(error.messages)


def test_it_refuses_a_window_that_ends_before_it_starts(alice, fleet):
    give(alice, 500)
    error = refusal(alice, gpus=1, starts_at=in_hours(3), ends_at=in_hours(2))
    assert error.code == "invalid" and "end after it starts" in error.messages[0]


def test_it_refuses_a_window_when_the_full_capacity_is_booked(alice, bob, fleet):
    give(alice, 100)
    give(bob, 100)
    book(alice, gpus=8, start_in=2, hours=2)

    error = refusal(bob, gpus=1, start_in=3, hours=2)

    assert error.code == "capacity"
    assert "The earliest such window starts" in error.messages[0]
    assert book(bob, gpus=1, start_in=4, hours=2).host == fleet  # right after alice's window


def test_it_limits_the_hours_one_person_holds_a_week(alice, fleet, settings):
    settings.RESERVATION_WEEKLY_HOURS_PER_USER = 3
    give(alice, 500)
    start = (timezone.now() + timedelta(days=7)).replace(hour=0, minute=0, second=0, microsecond=0)
    start -= timedelta(days=start.weekday())  # next Monday 00:00 UTC
    reservations.reservation_book(
        user=alice, gpus=1, starts_at=start + timedelta(hours=1), ends_at=start + timedelta(hours=3)
    )

    error = refusal(
        alice, gpus=1, starts_at=start + timedelta(days=2), ends_at=start + timedelta(days=2, hours=2)
    )

    assert error.code == "weekly" and "at most 1 more" in error.messages[0]


def test_a_cancelled_booking_frees_its_hold_and_costs_nothing(alice, fleet):
    give(alice, 20)
    booked = book(alice, gpus=8, start_in=2, hours=2)

    reservations.reservation_cancel(user=alice, reservation_id=booked.id)

    assert selectors.held_gpu_seconds(user=alice) == 0
    assert balance(alice) == 20 * HOUR
