"""Two bookings racing for the last host, or for the last credit, on PostgreSQL from two threads: each
takes the payer's lock and the host's, so exactly one wins and the other is told why."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.instances import reservations
from portal.instances.models import LaunchPolicy, Reservation
from provisioning.drivers import fake
from tests.conftest import give, make_user
from tests.support.race import at_once


@pytest.fixture
def one_host(transactional_db, settings):
    settings.DEVCLOUD_DRIVER = "fake"
    fake.install()
    fake.make_host("gpu-01", gpus=8)
    fake.make_image("cpu", sizes=["1x", "8x"])
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"])


def window(start_in: float = 2, hours: float = 2):
    start = timezone.now() + timedelta(hours=start_in)
    return {"starts_at": start, "ends_at": start + timedelta(hours=hours)}


def race(bookings):
    calls = iter(bookings)
    return at_once(lambda: reservations.reservation_book(**next(calls)), count=len(bookings))


def test_two_bookings_for_the_last_host_one_wins(one_host):
    alice, bob = make_user("alice@example.com"), make_user("bob@example.com")
    give(alice, 100)
    give(bob, 100)

    won, lost = race([{"user": alice, "gpus": 8, **window()}, {"user": bob, "gpus": 8, **window(start_in=3)}])

    assert len(won) == 1 and len(lost) == 1
    assert isinstance(lost[0], ValidationError) and lost[0].code == "capacity"
    assert Reservation.objects.count() == 1


def test_two_bookings_for_the_last_credit_one_wins(one_host):
    alice = make_user("alice@example.com")
    give(alice, 8)  # one GPU for 8 hours, or one booking of 4 GPU-hours and half of another

    won, lost = race(
        [
            {"user": alice, "gpus": 1, **window(start_in=1, hours=5)},
            {"user": alice, "gpus": 1, **window(start_in=7, hours=5)},
        ]
    )

    assert len(won) == 1 and len(lost) == 1
    assert isinstance(lost[0], ValidationError) and lost[0].code == "credit"
