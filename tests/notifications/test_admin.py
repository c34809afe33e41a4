"""The console shows notifications read-only: operators see what a user was told and whether the email
went out, and cannot add, edit or delete that record."""

import pytest

from portal.notifications.models import Kind, Notification

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/notifications/notification/"


@pytest.fixture
def notification(alice):
    return Notification.objects.create(
        user=alice,
        kind=Kind.ACCOUNT_SUSPENDED,
        event_key="suspension:1",
        context={"reason": "Mining"},
        email_attempts=2,
        email_error="ConnectionRefusedError: [Errno 111] Connection refused",
    )


def test_it_lists_notifications_with_their_email_state(olivia_client, notification):
    response = olivia_client.get(CHANGELIST, {"q": "alice@"})

    page = response.content.decode()
    assert response.status_code == 200
    assert "alice@example.com" in page
    assert "suspension:1" in page
    assert "failing" in page


def test_it_shows_a_notification_without_a_way_to_change_it(olivia_client, notification):
    response = olivia_client.get(f"{CHANGELIST}{notification.pk}/change/")

    page = response.content.decode()
    assert response.status_code == 200
    assert "Connection refused" in page
    assert 'name="_save"' not in page
    assert "deletelink" not in page


def test_it_refuses_to_add_edit_or_delete(olivia_client, notification):
    assert olivia_client.get(f"{CHANGELIST}add/").status_code == 403
    assert olivia_client.post(f"{CHANGELIST}{notification.pk}/delete/", {"post": "yes"}).status_code == 403
    olivia_client.post(f"{CHANGELIST}{notification.pk}/change/", {"event_key": "rewritten"})
    notification.refresh_from_db()
    assert notification.event_key == "suspension:1"


def test_it_keeps_developers_out(alice_client, notification):
    response = alice_client.get(CHANGELIST)

    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
