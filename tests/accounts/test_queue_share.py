"""An operator sets a person's share of the queue from the user's console page, with a reason the audit
log keeps; a share that is not a number from 0.01 to 9999.99 is refused with what is wrong; staff without
the operator action cannot."""

from decimal import Decimal

import pytest

from portal.accounts import services as accounts
from portal.audit.models import AuditEntry

from .test_operator_user_actions import action_url, user_editor_client  # noqa: F401  (a fixture)


def test_an_operator_sets_a_share_and_the_audit_log_keeps_why(otto, otto_client, alice):
    page = otto_client.get(f"/admin/accounts/user/{alice.pk}/change/").content.decode()
    assert "Share 1: their GPU use in the fair-share window is divided by it" in page

    response = otto_client.post(action_url(alice, "queue-share"), {"share": "2.5", "reason": "Course lab"})

    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.queue_share == Decimal("2.5")
    entry = AuditEntry.objects.get(actor=otto, action="setting.change")
    assert entry.reason == "Course lab"
    assert entry.details["changes"] == {"queue_share": {"old": "1", "new": "2.5"}}


@pytest.mark.parametrize("share", ["0", "-1", "abc", "0.001", "10000", "nan"])
def test_a_share_outside_its_range_is_refused_with_the_reason(otto_client, alice, share):
    response = otto_client.post(action_url(alice, "queue-share"), {"share": share, "reason": "Try"})

    assert response.status_code == 200
    page = response.content.decode()
    assert "A share is" in page
    alice.refresh_from_db()
    assert alice.queue_share == 1


def test_staff_without_the_operator_action_cannot_set_a_share(user_editor_client, alice):  # noqa: F811
    response = user_editor_client.post(action_url(alice, "queue-share"), {"share": "5", "reason": "Friend"})

    assert response.status_code == 403
    alice.refresh_from_db()
    assert alice.queue_share == 1


def test_setting_the_same_share_records_nothing(olivia, alice):
    accounts.user_queue_share_set(user=alice, actor=olivia, share="1", reason="No change")

    assert not AuditEntry.objects.filter(action="setting.change").exists()
