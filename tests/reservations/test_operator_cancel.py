"""An operator cancels a booking with a reason: the booker is told (email and dashboard), the audit log
records it, and the hold goes without any charge."""

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from portal.audit.models import AuditEntry
from portal.instances import reservations, selectors
from portal.instances.models import Reservation
from portal.notifications.models import Kind, Notification
from tests.conftest import balance, give, mails_to, text

from .conftest import book

HOUR = 3600


def test_an_operator_cancel_tells_the_person_why(alice, olivia, fleet, django_capture_on_commit_callbacks):
    give(alice, 20)
    booking = book(alice, gpus=8, start_in=2, hours=2)

    with django_capture_on_commit_callbacks(execute=True):
        reservations.reservation_operator_cancel(
            reservation_id=booking.id, actor=olivia, reason="The host needs a firmware update."
        )

    booking.refresh_from_db()
    assert booking.state == Reservation.State.CANCELLED and booking.cancelled_by == olivia
    [email] = mails_to(mail.outbox, alice)
    assert "cancelled your booking" in email.subject
    assert "The host needs a firmware update." in email.body
    assert Notification.objects.filter(user=alice, kind=Kind.RESERVATION_CANCELLED).count() == 1
    entry = AuditEntry.objects.get(action="reservation.operator_cancel")
    assert entry.actor == olivia and entry.reason == "The host needs a firmware update."
    assert selectors.held_gpu_seconds(user=alice) == 0 and balance(alice) == 20 * HOUR


def test_an_operator_cancel_needs_a_reason(alice, olivia, fleet):
    give(alice, 20)
    booking = book(alice)

    with pytest.raises(ValueError, match="needs a reason"):
        reservations.reservation_operator_cancel(reservation_id=booking.id, actor=olivia, reason="  ")
    assert Reservation.objects.get(pk=booking.pk).state == Reservation.State.BOOKED


def test_an_operator_cancels_from_the_console_and_the_person_is_told(
    alice, otto, otto_client, fleet, django_capture_on_commit_callbacks
):
    give(alice, 20)
    booking = book(alice)
    changelist = reverse("admin:instances_reservation_changelist")
    chosen = {"action": "cancel_bookings", "_selected_action": [str(booking.id)]}

    asked = otto_client.post(changelist, chosen)
    assert asked.status_code == 200 and "will be cancelled now" in text(asked)
    with django_capture_on_commit_callbacks(execute=True):
        done = otto_client.post(changelist, {**chosen, "reason": "Maintenance window.", "_confirm": "1"})

    assert done.status_code == 302
    assert Reservation.objects.get(pk=booking.pk).state == Reservation.State.CANCELLED
    assert "Maintenance window." in mails_to(mail.outbox, alice)[0].body
    assert AuditEntry.objects.get(action="reservation.operator_cancel").actor == otto


def test_staff_without_the_operators_permission_cannot_cancel(alice, oscar, fleet):
    give(alice, 20)
    booking = book(alice)
    browser = Client()
    browser.force_login(oscar)

    browser.post(
        reverse("admin:instances_reservation_changelist"),
        {"action": "cancel_bookings", "_selected_action": [str(booking.id)], "reason": "x", "_confirm": "1"},
    )

    assert Reservation.objects.get(pk=booking.pk).state == Reservation.State.BOOKED
