"""Only a superuser hands out power in the user admin: staff and superuser flags, groups, permissions and
passwords. Personas: olivia (superuser), otto (operator: the Operators group), alice and bob (developers).

The attacker here is staff who may change users (accounts.change_user, which operators needed before each
operator action had its own permission) and edits the user page's form by hand."""

import pytest
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import Group, Permission
from django.test import Client

from tests.conftest import PASSWORD, make_staff
from tests.support.forms import form_fields

NEW_PASSWORD = "a password the attacker chose"


def change_url(user):
    return f"/admin/accounts/user/{user.pk}/change/"


def password_url(user):
    return f"/admin/accounts/user/{user.pk}/password/"


@pytest.fixture
def uma(db):
    """Staff who may view and change users, and nothing else."""
    return make_staff("uma@ops.example.com", "accounts.view_user", "accounts.change_user")


@pytest.fixture
def uma_client(uma):
    browser = Client()
    browser.force_login(uma)
    return browser


def every_permission_ids():
    return [str(pk) for pk in Permission.objects.values_list("pk", flat=True)]


def post_user_page(client, user, **overrides):
    """Submit the user's change page as rendered, with `overrides` typed in (or added to the HTML)."""
    page = client.get(change_url(user))
    assert page.status_code == 200
    data = form_fields(page.content.decode())
    data.update({name: value if isinstance(value, list) else [value] for name, value in overrides.items()})
    data["_save"] = ["Save"]
    return client.post(change_url(user), data)


def privileges_of(user):
    user.refresh_from_db()
    return {
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "groups": sorted(user.groups.values_list("name", flat=True)),
        "permissions": user.user_permissions.count(),
    }


def test_staff_who_may_change_users_cannot_make_themselves_superuser(uma, uma_client):
    everything = Group.objects.create(name="Everything")
    everything.permissions.set(Permission.objects.all())
    before = privileges_of(uma)

    response = post_user_page(
        uma_client,
        uma,
        is_superuser="on",
        groups=[str(everything.pk)],
        user_permissions=every_permission_ids(),
    )

    # A staff account (uma's own too) is changed only by a superuser.
    assert response.status_code == 403
    assert privileges_of(uma) == before
    assert uma_client.get("/admin/auth/group/").status_code == 403


def test_staff_who_may_change_users_cannot_hand_out_staff_groups_or_permissions(uma_client, alice):
    everything = Group.objects.create(name="Everything")

    response = post_user_page(
        uma_client,
        alice,
        first_name="Alicia",
        is_staff="on",
        is_superuser="on",
        groups=[str(everything.pk)],
        user_permissions=every_permission_ids(),
    )

    assert response.status_code == 302
    assert privileges_of(alice) == {"is_staff": False, "is_superuser": False, "groups": [], "permissions": 0}
    # The ordinary fields still save: the form works, only the privileged fields are out of reach.
    assert alice.first_name == "Alicia"


def test_the_user_page_shows_staff_only_the_privileges_not_their_controls(uma_client, alice):
    page = uma_client.get(change_url(alice)).content.decode()
    fields = form_fields(page)

    for name in ("is_staff", "is_superuser", "groups", "user_permissions", "password"):
        assert name not in fields, name
    assert password_url(alice) not in page
    assert "Superuser status" in page  # shown read-only


def test_staff_who_may_change_users_cannot_set_someone_elses_password(uma_client, alice):
    assert uma_client.get(password_url(alice)).status_code == 403

    response = uma_client.post(
        password_url(alice), {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"}
    )

    assert response.status_code == 403
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD) and not alice.check_password(NEW_PASSWORD)


def test_staff_who_may_change_users_cannot_take_over_a_superuser_by_email(uma_client, olivia):
    # Changing olivia's address to the attacker's, then asking for a reset link, would hand over her account.
    response = uma_client.post(change_url(olivia), {"email": "attacker@evil.example", "_save": "Save"})

    assert response.status_code == 403
    olivia.refresh_from_db()
    assert olivia.email == "olivia@ops.example.com"


def test_an_operator_cannot_edit_users_or_passwords(otto, otto_client, alice):
    assert otto_client.get(change_url(alice)).status_code == 200  # may look

    edited = otto_client.post(change_url(otto), {"email": otto.email, "is_superuser": "on", "_save": "Save"})
    password = otto_client.post(password_url(alice), {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD})

    assert (edited.status_code, password.status_code) == (403, 403)
    assert privileges_of(otto)["is_superuser"] is False
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


def test_a_superuser_still_grants_staff_groups_and_sets_passwords(olivia, alice, client):
    client.force_login(olivia)
    operators = Group.objects.get(name="Operators")

    post_user_page(client, alice, is_staff="on", groups=[str(operators.pk)])
    response = client.post(
        password_url(alice), {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"}
    )

    assert response.status_code == 302
    assert privileges_of(alice) == {
        "is_staff": True,
        "is_superuser": False,
        "groups": ["Operators"],
        "permissions": 0,
    }
    assert alice.check_password(NEW_PASSWORD)
    browser = Client()
    browser.post("/accounts/login/", {"username": "alice@example.com", "password": NEW_PASSWORD})
    assert browser.session[SESSION_KEY] == str(alice.pk)
