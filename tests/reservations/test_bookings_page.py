"""The bookings page: a form with the window's dates and times, the person's bookings, and the refusals'
messages; the launch page links to it and shows what is held."""

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from portal.instances.models import Reservation
from tests.conftest import give, text

PAGE = "/instances/reservations/"


def form_time(hours_from_now: float) -> str:
    return (timezone.now() + timedelta(hours=hours_from_now)).strftime("%Y-%m-%dT%H:%M")


def test_it_books_from_the_page_and_lists_the_booking(alice, alice_client, fleet):
    give(alice, 20)
    page = alice_client.get(PAGE)
    assert 'for="id_starts_at"' in page.content.decode() and 'type="datetime-local"' in page.content.decode()

    done = alice_client.post(
        PAGE, {"gpus": 8, "starts_at": form_time(2), "ends_at": form_time(4)}, follow=True
    )

    assert Reservation.objects.filter(user=alice, gpus=8).count() == 1
    assert "Booked 8 GPUs" in text(done) and "gpu-01" in text(done)
    assert "Held for your bookings: 16" in text(done)
    launch_page = text(alice_client.get(reverse("instances:list")))
    assert "held for your bookings" in launch_page


def test_it_shows_why_a_booking_is_refused(alice, alice_client, fleet):
    give(alice, 20)

    refused = alice_client.post(PAGE, {"gpus": 8, "starts_at": form_time(-3), "ends_at": form_time(-1)})

    assert refused.status_code == 400 and "starts in the past" in text(refused)
    assert not Reservation.objects.exists()


def test_the_booker_cancels_from_the_page(alice, alice_client, bob_client, fleet):
    give(alice, 20)
    alice_client.post(PAGE, {"gpus": 1, "starts_at": form_time(2), "ends_at": form_time(3)})
    booking = Reservation.objects.get()
    cancel = reverse("instances:reservation_cancel", args=[booking.id])

    assert bob_client.post(cancel).status_code == 404
    alice_client.post(cancel)

    assert Reservation.objects.get().state == Reservation.State.CANCELLED
