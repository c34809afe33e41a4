"""When a window ends, the beat settles it: the hold is released, what ran inside was billed per
GPU-second as it ran, and the operators' share of the unused time is charged once. Before the end, the
booker is warned about what runs in it."""

from datetime import timedelta

from django.core import mail
from django.utils import timezone

from portal.credits.models import LedgerEntry
from portal.instances import lifecycle, limits, reservations, selectors, tasks
from portal.instances.models import Instance, Reservation
from portal.notifications.models import Kind, Notification
from tests.conftest import balance, give, mails_to

from .conftest import book, launch, open_now

HOUR = 3600


def end_window(reservation: Reservation) -> None:
    """The clock reaches the window's end (the deadline of the instances launched on it)."""
    ended = timezone.now() - timedelta(seconds=1)
    Reservation.objects.filter(pk=reservation.pk).update(starts_at=ended - timedelta(hours=2), ends_at=ended)
    Instance.objects.filter(reservation=reservation).update(deadline_at=ended)


def test_an_unused_window_releases_its_hold_and_charges_the_operators_share(alice, fleet, settings):
    settings.RESERVATION_UNUSED_CHARGE_PERCENT = 25
    give(alice, 20)
    booking = book(alice, gpus=8, start_in=2, hours=2)
    end_window(booking)

    assert tasks.reservations_tick.apply().get()["settled"] == [str(booking.id)]
    assert reservations.reservations_settle() == []  # once

    booking.refresh_from_db()
    assert booking.state == Reservation.State.SETTLED and booking.unused_charge_gpu_seconds == 4 * HOUR
    assert selectors.held_gpu_seconds(user=alice) == 0
    assert balance(alice) == 16 * HOUR  # 20, less a quarter of the 16 booked
    entry = LedgerEntry.objects.get(idempotency_key=f"reservation-unused:{booking.id}")
    assert entry.gpu_seconds == -4 * HOUR and "unused" in entry.reason


def test_time_used_in_the_window_is_billed_as_it_ran_and_only_the_rest_is_unused(
    alice, fleet, settings, django_capture_on_commit_callbacks
):
    settings.RESERVATION_UNUSED_CHARGE_PERCENT = 50
    give(alice, 20)
    booking = open_now(book(alice, gpus=8, start_in=2, hours=2))
    instance = launch(alice, "8x")
    half_hour_ago = timezone.now() - timedelta(minutes=30)
    Instance.objects.filter(pk=instance.pk).update(ready_at=half_hour_ago, metered_until=half_hour_ago)

    lifecycle.meter_tick()  # 8 GPUs x 30 minutes
    instance.refresh_from_db()
    used = instance.charged_gpu_seconds
    assert used >= 4 * HOUR
    assert selectors.held_gpu_seconds(user=alice) == 16 * HOUR - used  # the hold shrinks as it is used

    with django_capture_on_commit_callbacks(execute=True):
        end_window(booking)
        limits.enforce_deadlines()  # the window's end stops it
    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPED
    used = instance.charged_gpu_seconds
    reservations.reservations_settle()

    booking.refresh_from_db()
    assert booking.used_gpu_seconds == used
    assert booking.unused_charge_gpu_seconds == (16 * HOUR - used) // 2
    assert balance(alice) == 20 * HOUR - used - (16 * HOUR - used) // 2


def test_the_booker_is_warned_before_the_window_ends_on_what_runs_in_it(alice, fleet, settings):
    settings.SESSION_END_WARNING_MINUTES = 30
    give(alice, 20)
    booking = open_now(book(alice, gpus=8, start_in=2, hours=2), hours_left=0.25)
    launch(alice, "8x")

    warned = reservations.reservations_warn_ending()
    again = reservations.reservations_warn_ending()

    assert warned == [str(booking.id)] and again == []
    assert Notification.objects.filter(user=alice, kind=Kind.RESERVATION_ENDING).count() == 1


def test_no_warning_for_a_window_nothing_runs_in(alice, fleet):
    give(alice, 20)
    open_now(book(alice, gpus=8, start_in=2, hours=2), hours_left=0.25)

    assert reservations.reservations_warn_ending() == []
    assert mails_to(mail.outbox, alice) == []
