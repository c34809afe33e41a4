"""The booking calendar on the bookings page (linked from the launch page): each hour of the coming week says how many
whole 8x hosts are free for it, by the same rule a booking is judged by, and picking an hour fills in the
booking form."""

import re
from datetime import timedelta

from django.utils import timezone

from portal.instances import lifecycle, reservations, services
from portal.instances.models import LaunchPolicy, Reservation
from provisioning.drivers import fake
from tests.conftest import give

from .conftest import book

PAGE = "/instances/reservations/"


def cells(page) -> dict:
    """The calendar's hours on a page: {"2026-12-05T09:00": "2", ...} (what each cell shows)."""
    html = page.content.decode()
    found = {}
    for starts_at, shown in re.findall(r'data-starts-at="([^"]+)">([^<]*)<', html):
        found[starts_at] = shown
    return found


def hour_from_now(hours: int):
    return (timezone.now() + timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0)


def test_each_hour_agrees_with_what_a_booking_would_find(alice, bob, fleet):
    fake.make_host("gpu-02", gpus=8)
    give(alice, 100)
    give(bob, 100)
    book(alice, gpus=8, start_in=30, hours=3)  # one whole host gone for those hours
    running = services.instance_launch(user=bob, size="1x", image_key="cpu")
    lifecycle.instance_provision(instance_id=running.id)  # on a host, for at most 12 hours
    now = timezone.now()
    policy = LaunchPolicy.current()

    calendar = reservations.free_calendar(now=now)

    hosts = list(reservations._hosts_for(8))
    checked = 0
    for _, hours in calendar:
        for cell in hours:
            if cell.starts_at is None:
                continue
            rooms = [
                reservations.host_room(
                    host, cell.starts_at, cell.starts_at + timedelta(hours=1), policy=policy, now=now
                )
                for host in hosts
            ]
            assert cell.whole_hosts == sum(room >= 8 for room in rooms), cell
            assert cell.gpus == sum(max(room, 0) for room in rooms), cell
            checked += 1
    assert checked >= 6 * 24
    # Soon: bob's 1x holds one host in part; in alice's window (bob's session long over) her booking
    # holds one; after it, both are free.
    by_start = {cell.starts_at: cell for _, hours in calendar for cell in hours if cell.starts_at}
    assert (by_start[hour_from_now(2)].whole_hosts, by_start[hour_from_now(2)].gpus) == (1, 15)
    assert (by_start[hour_from_now(31)].whole_hosts, by_start[hour_from_now(31)].gpus) == (1, 8)
    assert by_start[hour_from_now(40)].whole_hosts == 2


def test_the_bookings_page_shows_it_and_the_launch_page_links_there(alice, alice_client, fleet):
    give(alice, 100)
    book(alice, gpus=8, start_in=30, hours=3)

    bookings_page = cells(alice_client.get(PAGE))
    launch_page = alice_client.get("/instances/").content.decode()

    soon, booked = hour_from_now(2), hour_from_now(31)
    assert bookings_page[f"{soon:%Y-%m-%dT%H:%M}"] == "1"
    assert bookings_page[f"{booked:%Y-%m-%dT%H:%M}"] == "0"
    # The launch page stays cheap (tests/instances/test_launch_catalogue_cache.py): a link, no calendar.
    assert (
        'data-testid="bookings-link"' in launch_page and 'data-testid="booking-calendar"' not in launch_page
    )


def test_picking_an_hour_fills_in_a_one_hour_window_for_a_whole_host(alice, alice_client, fleet):
    picked = hour_from_now(5)

    page = alice_client.get(PAGE, {"starts_at": f"{picked:%Y-%m-%dT%H:%M}", "gpus": "8"}).content.decode()

    assert re.search(rf'name="starts_at" value="{picked:%Y-%m-%d %H:%M}(:00)?"', page)
    assert re.search(rf'name="ends_at" value="{picked + timedelta(hours=1):%Y-%m-%d %H:%M}(:00)?"', page)


def test_a_garbled_hour_is_ignored_not_an_error(alice, alice_client, fleet):
    page = alice_client.get(PAGE, {"starts_at": "next tuesday", "gpus": "lots"})

    assert page.status_code == 200
    assert 'name="starts_at" value=' not in page.content.decode()


def test_the_next_free_hour_agrees_with_host_room_and_reads_the_fleet_once(
    alice, bob, fleet, django_assert_max_num_queries
):
    # The refusal's "free from ..." hint and the bookings page ask for the next whole host free; trying
    # every hour of the horizon host by host asked the database four times per host and hour.
    second = fake.make_host("gpu-02", gpus=8)
    # gpu-01 is booked from 2 to 30 hours from now; gpu-02 from 2 to 20 and from 24 to 50, which leaves
    # it 4 free hours between: too few for 6.
    for user, host, start_in, end_in in ((alice, fleet, 2, 30), (bob, second, 2, 20), (bob, second, 24, 50)):
        Reservation.objects.create(
            user=user,
            host=host,
            gpus=8,
            starts_at=hour_from_now(start_in),
            ends_at=hour_from_now(end_in),
            hold_gpu_seconds=0,
        )
    now = timezone.now()
    policy = LaunchPolicy.current()

    with django_assert_max_num_queries(6):
        found = reservations.next_free_start(gpus=8, duration=timedelta(hours=6), after=now, now=now)

    start = hour_from_now(1)
    while not any(
        reservations.host_room(host, start, start + timedelta(hours=6), policy=policy, now=now) >= 8
        for host in (fleet, second)
    ):
        start += timedelta(hours=1)
    assert found == start == hour_from_now(30)
