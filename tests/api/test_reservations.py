"""POST/GET/DELETE /api/v1/reservations: booking through the same service as the page, with its refusals
as problem details, the hold in /me, and a launch that names a booking."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.instances import lifecycle
from portal.instances.models import Instance, LaunchPolicy, Reservation
from provisioning.drivers import fake
from tests.conftest import give

from .conftest import assert_problem, token_for

URL = "/api/v1/reservations"
HOUR = 3600


@pytest.fixture
def host(db, cpu):
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"])
    return fake.make_host("gpu-01", gpus=8)


def window(start_in=2, hours=2):
    start = timezone.now() + timedelta(hours=start_in)
    return {"starts_at": start.isoformat(), "ends_at": (start + timedelta(hours=hours)).isoformat()}


def test_it_books_lists_and_cancels(alice, alice_api, host):
    give(alice, 20)

    booked = alice_api.post(URL, {"gpus": 8, **window()})
    assert booked.status_code == 201, booked.content
    body = booked.json()
    assert body["gpus"] == 8 and body["host"] == "gpu-01" and body["hold_gpu_seconds"] == 16 * HOUR
    assert alice_api.get("/api/v1/me").json()["held_gpu_seconds"] == 16 * HOUR
    assert [row["id"] for row in alice_api.get(URL).json()] == [body["id"]]

    cancelled = alice_api.delete(f"{URL}/{body['id']}")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert alice_api.get("/api/v1/me").json()["held_gpu_seconds"] == 0


def test_refusals_are_problems_saying_why(alice, alice_api, bob, host):
    give(alice, 20)
    give(bob, 100)
    assert_problem(alice_api.post(URL, {"gpus": 8, **window(start_in=-3)}), 400, kind="validation")
    assert_problem(alice_api.post(URL, {"gpus": 8, **window(hours=30)}), 400, kind="validation")
    assert_problem(alice_api.post(URL, {"gpus": 8, **window(hours=3)}), 402, kind="insufficient-credit")
    Reservation.objects.create(
        user=bob,
        host=host,
        gpus=8,
        starts_at=timezone.now() + timedelta(hours=1),
        ends_at=timezone.now() + timedelta(hours=5),
        hold_gpu_seconds=0,
    )
    full = assert_problem(alice_api.post(URL, {"gpus": 1, **window()}), 409, kind="no-capacity")
    assert "earliest such window" in full["detail"]


def test_someone_elses_booking_is_a_404(alice, alice_api, bob, host):
    give(alice, 20)
    booking = alice_api.post(URL, {"gpus": 1, **window()}).json()
    bob_api = token_for(bob)[1]

    assert_problem(bob_api.get(f"{URL}/{booking['id']}"), 404)
    assert_problem(bob_api.delete(f"{URL}/{booking['id']}"), 404)
    launch = bob_api.post("/api/v1/instances", {"size": "1x", "image": "cpu", "reservation": booking["id"]})
    assert_problem(launch, 404)


def test_a_launch_names_its_open_booking(alice, alice_api, host):
    give(alice, 20)
    booking = alice_api.post(URL, {"gpus": 8, **window()}).json()
    Reservation.objects.filter(id=booking["id"]).update(
        starts_at=timezone.now() - timedelta(minutes=1), ends_at=timezone.now() + timedelta(hours=1)
    )

    launched = alice_api.post(
        "/api/v1/instances", {"size": "8x", "image": "cpu", "reservation": booking["id"]}
    )

    assert launched.status_code == 201, launched.content
    lifecycle.instance_provision(instance_id=launched.json()["id"])
    instance = Instance.objects.get(id=launched.json()["id"])
    assert str(instance.reservation_id) == booking["id"] and instance.state == Instance.State.RUNNING


def test_availability_says_when_a_whole_host_is_free(alice, alice_api, bob, host):
    Reservation.objects.create(
        user=bob,
        host=host,
        gpus=8,
        starts_at=timezone.now() - timedelta(minutes=5),
        ends_at=timezone.now() + timedelta(hours=3),
        hold_gpu_seconds=0,
    )

    answer = alice_api.get(f"{URL}/availability", {"gpus": 8, "hours": 1}).json()

    assert answer["free_from"] is not None
    assert timezone.datetime.fromisoformat(answer["free_from"]) >= timezone.now() + timedelta(hours=3)


def test_a_read_only_token_cannot_book(alice, host):
    give(alice, 20)
    reader = token_for(alice, scope="read")[1]

    assert_problem(reader.post(URL, {"gpus": 1, **window()}), 403)


def test_an_idempotency_key_used_for_a_launch_on_a_booking_does_not_replay_for_a_launch_off_it(
    alice, alice_api, host
):
    # A client that retries with the key of its booked launch, but without the booking, must not be told
    # that its launch off the booking happened: that launch would have been paid differently.
    give(alice, 20)
    booking = alice_api.post(URL, {"gpus": 8, **window()}).json()
    Reservation.objects.filter(id=booking["id"]).update(
        starts_at=timezone.now() - timedelta(minutes=1), ends_at=timezone.now() + timedelta(hours=1)
    )
    key = {"Idempotency-Key": "nightly-run-7"}
    on_booking = alice_api.post(
        "/api/v1/instances", {"size": "1x", "image": "cpu", "reservation": booking["id"]}, headers=key
    )
    assert on_booking.status_code == 201, on_booking.content

    off_booking = alice_api.post("/api/v1/instances", {"size": "1x", "image": "cpu"}, headers=key)

    body = assert_problem(off_booking, 422, kind="idempotency-key-reused")
    assert "booking" in body["detail"]
    again = alice_api.post(
        "/api/v1/instances", {"size": "1x", "image": "cpu", "reservation": booking["id"]}, headers=key
    )
    assert again.status_code == 200 and again.json()["id"] == on_booking.json()["id"]
    assert Instance.objects.filter(user=alice).count() == 1
