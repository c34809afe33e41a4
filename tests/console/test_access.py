"""Who may open the console pages: staff only; the audit log also needs its view permission."""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

PAGES = ["/console/", "/console/?range=30d", "/console/audit/", "/console/audit/export.csv"]


@pytest.mark.parametrize("url", PAGES)
def test_it_refuses_a_developer(alice_client, url):
    assert alice_client.get(url).status_code == 403


@pytest.mark.parametrize("url", PAGES)
def test_it_sends_an_anonymous_visitor_to_the_admin_login(client, url, db):
    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/console/")


@pytest.mark.parametrize("url", PAGES)
def test_it_refuses_a_deactivated_operator(olivia, url):
    client = Client()
    client.force_login(olivia)
    olivia.is_active = False
    olivia.save()

    assert client.get(url).status_code in (302, 403)
    assert b"Operator dashboard" not in client.get(url).content


@pytest.mark.parametrize("url", PAGES)
def test_it_opens_every_page_to_an_operator(olivia_client, url):
    assert olivia_client.get(url).status_code == 200


def test_it_shows_the_dashboard_to_staff_without_permissions(oscar):
    client = Client()
    client.force_login(oscar)

    assert client.get("/console/").status_code == 200


@pytest.mark.parametrize("url", ["/console/audit/", "/console/audit/export.csv"])
def test_it_keeps_the_audit_log_from_staff_without_its_view_permission(oscar, url):
    client = Client()
    client.force_login(oscar)

    assert client.get(url).status_code == 403
    oscar.user_permissions.add(Permission.objects.get(codename="view_auditentry"))
    client.force_login(oscar)
    assert client.get(url).status_code == 200


def test_it_shows_the_log_in_admin_read_only(olivia_client, olivia, alice):
    from portal.audit.services import audit_record

    entry = audit_record(actor=olivia, action="user.suspend", target=alice, reason="Abuse")

    assert olivia_client.get("/admin/console/auditentry/").status_code == 200
    assert olivia_client.get(f"/admin/console/auditentry/{entry.pk}/change/").status_code == 200
    assert olivia_client.get("/admin/console/auditentry/add/").status_code == 403
    assert olivia_client.get(f"/admin/console/auditentry/{entry.pk}/delete/").status_code == 403
    response = olivia_client.post(f"/admin/console/auditentry/{entry.pk}/change/", {"reason": "rewritten"})
    assert response.status_code == 403
    entry.refresh_from_db()
    assert entry.reason == "Abuse"
