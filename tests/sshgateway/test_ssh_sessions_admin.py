"""The operator's list of SSH sessions: who reached which instance, when, and how much went through.
Read-only: only the gateway writes it."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.instances.models import Image, Instance
from portal.sshgateway.models import SshSession

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/sshgateway/sshsession/"


@pytest.fixture
def session(alice):
    image = Image.objects.create(key="cpu-admin", name="CPU JupyterLab", sizes=["1x"], reference="devcloud/cpu:x")
    instance = Instance.objects.create(user=alice, size="1x", image=image, state=Instance.State.RUNNING)
    started = timezone.now() - timedelta(minutes=90)
    return SshSession.objects.create(
        user=alice, instance=instance, key_fingerprint="SHA256:abc", key_name="laptop",
        client_address="203.0.113.7:51234", gateway="gw-1:42", started_at=started,
        last_seen_at=started + timedelta(minutes=61), ended_at=started + timedelta(minutes=61),
        bytes_from_client=5 * 1024 * 1024, bytes_to_client=2048,
    )


def test_the_operator_sees_who_connected_where_when_and_how_much(olivia, session):
    browser = Client()
    browser.force_login(olivia)

    page = browser.get(LIST_URL).content.decode()

    assert "alice@example.com" in page
    assert session.instance.short_id in page
    assert "203.0.113.7:51234" in page
    assert "1:01:00" in page
    assert "5.0\xa0MB" in page and "2.0\xa0KB" in page


def test_nobody_can_add_change_or_delete_a_session_record(olivia, session):
    browser = Client()
    browser.force_login(olivia)

    add = browser.get(f"{LIST_URL}add/")
    delete = browser.post(f"{LIST_URL}{session.pk}/delete/", {"post": "yes"})
    change = browser.post(f"{LIST_URL}{session.pk}/change/", {"bytes_to_client": "0"})

    assert add.status_code == 403
    assert delete.status_code == 403
    assert change.status_code == 403
    assert SshSession.objects.get(pk=session.pk).bytes_to_client == 2048
