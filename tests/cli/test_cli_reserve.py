"""`devcloud reserve`, `devcloud reservations` (and `cancel`) and `launch --reservation`, against the live
portal."""

import json
from datetime import timedelta

from django.utils import timezone

from portal.instances.models import Instance, LaunchPolicy, Reservation

from .test_cli import CREDIT, OK, REFUSED, USAGE, logged_in  # noqa: F401  (a fixture, used by name)


def utc_text(hours_from_now: float) -> str:
    return (timezone.now() + timedelta(hours=hours_from_now)).strftime("%Y-%m-%dT%H:%M")


def test_reserve_lists_and_cancels(logged_in, alice):  # noqa: F811
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"])

    booked = logged_in("reserve", "--gpus", "8", "--start", utc_text(2), "--hours", "2")
    assert booked.returncode == OK, booked.stderr
    assert "Booked 8 GPUs on" in booked.stdout
    booking = Reservation.objects.get(user=alice)

    listed = logged_in("reservations")
    assert booking.short_id in listed.stdout and "booked" in listed.stdout
    assert "A whole host is next free" in listed.stdout

    cancelled = logged_in("reservations", "cancel", booking.short_id)
    assert cancelled.returncode == OK, cancelled.stderr
    assert Reservation.objects.get().state == Reservation.State.CANCELLED
    assert json.loads(logged_in("reservations", "--json").stdout)[0]["state"] == "cancelled"


def test_refusals_say_why_with_the_exit_code(logged_in, alice):  # noqa: F811
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"])

    past = logged_in("reserve", "--gpus", "1", "--start", utc_text(-3), "--hours", "1")
    assert past.returncode == REFUSED and "starts in the past" in past.stderr
    short = logged_in("reserve", "--gpus", "8", "--start", utc_text(2), "--hours", "4")  # 32 > 25 GPU-hours
    assert short.returncode == CREDIT and "Not enough credit" in short.stderr
    both = logged_in("reserve", "--start", utc_text(2), "--hours", "1", "--end", utc_text(4))
    assert both.returncode == USAGE


def test_launch_names_an_open_booking(logged_in, alice):  # noqa: F811
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"])
    assert logged_in("reserve", "--gpus", "8", "--start", utc_text(2), "--hours", "2").returncode == OK
    booking = Reservation.objects.get()
    Reservation.objects.filter(pk=booking.pk).update(starts_at=timezone.now() - timedelta(minutes=1))

    launched = logged_in(
        "launch", "--size", "8x", "--image", "cpu", "--reservation", booking.short_id, "--wait"
    )

    assert launched.returncode == OK, launched.stderr
    assert Instance.objects.get(user=alice).reservation_id == booking.id
