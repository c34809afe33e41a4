"""The "Operators" group the migrations create: a superuser puts someone in it, and they can run the
console's operator actions but cannot hand themselves (or anyone) more power."""

from django.contrib.auth.models import Group
from django.test import Client

from portal.console.models import OperatorAction
from tests.conftest import make_staff


def operator_from_the_migrated_group():
    """Staff whose only power is the group as migration 0004 left it (no fixture re-seeds it)."""
    user = make_staff("nina@ops.example.com")
    user.groups.add(Group.objects.get(name="Operators"))
    browser = Client()
    browser.force_login(user)
    return user, browser


def test_the_migrated_group_may_run_every_operator_action(db):
    user, _ = operator_from_the_migrated_group()

    actions = [codename for codename, _ in OperatorAction._meta.permissions]
    assert len(actions) == 13
    assert all(user.has_perm(f"console.{codename}") for codename in actions)


def test_the_migrated_group_cannot_grant_power_or_set_passwords(db, alice):
    user, browser = operator_from_the_migrated_group()

    suspended = browser.post(f"/admin/accounts/user/{alice.pk}/suspend/", {"reason": "Mining"})
    made_superuser = browser.post(
        f"/admin/accounts/user/{user.pk}/change/",
        {"email": user.email, "is_superuser": "on", "_save": "Save"},
    )
    password = browser.post(
        f"/admin/accounts/user/{alice.pk}/password/", {"password1": "x" * 20, "password2": "x" * 20}
    )
    groups = browser.get("/admin/auth/group/")
    new_user = browser.get("/admin/accounts/user/add/")

    assert suspended.status_code == 302
    assert [made_superuser.status_code, password.status_code, groups.status_code, new_user.status_code] == [
        403,
        403,
        403,
        403,
    ]
    user.refresh_from_db()
    assert not user.is_superuser
    assert browser.get("/admin/console/auditentry/").status_code == 200


def test_an_operator_reads_the_ssh_session_list_but_cannot_change_it(otto_client, otto):
    assert otto.has_perm("sshgateway.view_sshsession")
    assert not otto.has_perm("sshgateway.change_sshsession")

    assert otto_client.get("/admin/sshgateway/sshsession/").status_code == 200
