"""What the reservation tests share: one 8-GPU fake host with an image for both sizes, the launch policy
open to both, and helpers to book, launch and move a window to now."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.instances import lifecycle, reservations, services
from portal.instances.models import Instance, LaunchPolicy, Reservation
from provisioning.drivers import fake


@pytest.fixture(autouse=True)
def tasks_run_inline():
    from portal.celery import app

    saved = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = saved


@pytest.fixture
def fleet(db, cloud, settings):
    """One 8-GPU host (gpu-01); 1x sessions last at most 12 hours, 8x 4."""
    settings.RESERVATION_MAX_AHEAD_DAYS = 14
    settings.RESERVATION_MAX_HOURS = 24
    settings.RESERVATION_WEEKLY_HOURS_PER_USER = 48
    settings.RESERVATION_UNUSED_CHARGE_PERCENT = 0
    settings.LAUNCH_MIN_CREDIT_MINUTES = 15
    host = fake.make_host("gpu-01", gpus=8)
    fake.make_image("cpu", sizes=["1x", "8x"])
    LaunchPolicy.current()
    LaunchPolicy.objects.update(
        free_sizes=["1x", "8x"], max_session_hours={"1x": 12, "8x": 4}, max_live_instances=10
    )
    return host


def in_hours(hours: float):
    return timezone.now() + timedelta(hours=hours)


def book(user, *, gpus=8, start_in=2, hours=2, project=None) -> Reservation:
    """Book `gpus` GPUs from `start_in` hours from now for `hours` hours."""
    return reservations.reservation_book(
        user=user,
        gpus=gpus,
        starts_at=in_hours(start_in),
        ends_at=in_hours(start_in + hours),
        project=project,
    )


def open_now(reservation: Reservation, *, hours_left: float = 2) -> Reservation:
    """Move the booking's window so that it opened a minute ago (the clock reaching it)."""
    Reservation.objects.filter(pk=reservation.pk).update(
        starts_at=timezone.now() - timedelta(minutes=1), ends_at=in_hours(hours_left)
    )
    reservation.refresh_from_db()
    return reservation


def launch(user, size="1x", **kwargs) -> Instance:
    """Launch and run the provision task as a worker would; returns the instance, refreshed."""
    instance = services.instance_launch(user=user, size=size, image_key="cpu", **kwargs)
    lifecycle.instance_provision(instance_id=instance.id)
    instance.refresh_from_db()
    return instance
