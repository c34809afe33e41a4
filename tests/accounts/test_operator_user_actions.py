"""Suspend, unsuspend and open sizes each take their own operator permission. otto (the Operators group)
does all three without being able to edit users; staff who may change users (accounts.change_user, what
these actions used to require) may do none of them."""

import pytest
from django.test import Client

from portal.accounts import services as accounts
from portal.audit.models import AuditEntry
from tests.conftest import make_staff

REASON = "Crypto mining on the GPUs."


def action_url(user, action):
    return f"/admin/accounts/user/{user.pk}/{action}/"


@pytest.fixture
def user_editor_client(db):
    browser = Client()
    browser.force_login(make_staff("uma@ops.example.com", "accounts.view_user", "accounts.change_user"))
    return browser


def test_an_operator_suspends_and_unsuspends_a_user(otto, otto_client, alice):
    suspended = otto_client.post(action_url(alice, "suspend"), {"reason": REASON})
    alice.refresh_from_db()
    assert suspended.status_code == 302 and alice.is_suspended

    lifted = otto_client.post(action_url(alice, "unsuspend"), {"reason": "Appeal accepted"})
    alice.refresh_from_db()
    assert lifted.status_code == 302 and not alice.is_suspended

    codes = list(AuditEntry.objects.filter(actor=otto).order_by("id").values_list("action", flat=True))
    assert codes == ["user.suspend", "user.unsuspend"]


def test_an_operator_opens_a_size_to_one_user(otto_client, alice):
    response = otto_client.post(action_url(alice, "launch-sizes"), {"sizes": ["8x"], "reason": "Partner"})

    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.extra_sizes == ["8x"]


def test_staff_who_may_change_users_cannot_suspend_unsuspend_or_open_sizes(
    user_editor_client, alice, olivia
):
    sizes = {"sizes": ["8x"], "reason": "Partner"}
    refused = [
        user_editor_client.post(action_url(alice, "suspend"), {"reason": REASON}).status_code,
        user_editor_client.post(action_url(alice, "launch-sizes"), sizes).status_code,
    ]
    accounts.user_suspend(user=alice, actor=olivia, reason=REASON)
    refused.append(user_editor_client.post(action_url(alice, "unsuspend"), {"reason": "Friend"}).status_code)

    assert refused == [403, 403, 403]
    alice.refresh_from_db()
    assert alice.is_suspended and alice.extra_sizes == []


def test_each_user_action_has_its_own_permission(alice):
    browser = Client()
    browser.force_login(make_staff("sue@ops.example.com", "accounts.view_user", "console.suspend_user"))

    assert browser.post(action_url(alice, "suspend"), {"reason": REASON}).status_code == 302
    assert browser.post(action_url(alice, "unsuspend"), {"reason": "Changed my mind"}).status_code == 403
    sizes = {"sizes": ["8x"], "reason": "Partner"}
    assert browser.post(action_url(alice, "launch-sizes"), sizes).status_code == 403
    alice.refresh_from_db()
    assert alice.is_suspended and alice.extra_sizes == []
