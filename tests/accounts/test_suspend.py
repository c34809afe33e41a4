"""Suspending and unsuspending an account: what stops, what is refused, what is kept, who may do it, and
the operator's buttons on the user page. Personas: alice (developer), bob (developer), olivia (operator)."""

import re
import threading

import pytest
from django.core import mail
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.urls import reverse

from portal.accounts import services as accounts
from portal.accounts.models import User
from portal.audit.models import AuditEntry
from portal.credits import services as credits
from portal.credits.models import BonusProgram, LedgerEntry
from portal.instances import entitlements, lifecycle
from portal.instances import services as instances
from portal.instances.models import Instance
from portal.notifications.models import Notification
from provisioning.drivers import fake
from tests.conftest import PASSWORD, balance, give, make_user, text

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600
NOTICE = "Your account is suspended: Crypto mining on the GPUs. Contact support to lift it."


@pytest.fixture(autouse=True)
def tasks_run_inline():
    """Teardowns and emails run inline, as the test settings say. Some earlier tests leave the Celery app
    publishing to a broker instead (they first read its configuration inside
    override_settings(CELERY_TASK_ALWAYS_EAGER=False)), so this file does not rely on the setting."""
    from portal.celery import app

    saved = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = saved


@pytest.fixture
def launched(alice):
    """alice with 25 GPU-hours, one running and one queued 1x instance."""
    give(alice, 25)
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    running = instances.instance_launch(user=alice, size="1x", image_key="cpu")
    assert lifecycle.instance_provision(instance_id=running.id) == "running"
    queued = instances.instance_launch(user=alice, size="1x", image_key="cpu")
    running.refresh_from_db()
    return running, queued


def suspend(user, actor, reason="Crypto mining on the GPUs."):
    return accounts.user_suspend(user=user, actor=actor, reason=reason)


def test_it_stops_running_and_queued_instances_and_keeps_the_credits(
    alice, olivia, launched, cloud, django_capture_on_commit_callbacks
):
    running, queued = launched
    before = balance(alice)

    with django_capture_on_commit_callbacks(execute=True):
        suspended = suspend(alice, olivia)

    running.refresh_from_db()
    queued.refresh_from_db()
    assert suspended.is_suspended
    assert suspended.suspended_reason == "Crypto mining on the GPUs."
    assert suspended.suspended_by_name == "Olivia Operator <olivia@ops.example.com>"
    # The running one was torn down by the teardown task its stop queued; the queued one never started.
    assert (running.state, running.stop_reason) == (Instance.State.STOPPED, "suspended")
    assert (queued.state, queued.stop_reason) == (Instance.State.STOPPED, "suspended")
    assert cloud.containers == {}
    # Only what the running instance burned until the stop was charged; nothing was taken away.
    assert balance(alice) == before - running.charged_gpu_seconds
    assert set(LedgerEntry.objects.filter(account__user=alice).values_list("kind", flat=True)) <= {
        LedgerEntry.Kind.ADJUSTMENT,
        LedgerEntry.Kind.GRANT,
        LedgerEntry.Kind.USAGE,
    }


def test_the_owner_sees_why_their_instances_stopped(alice, olivia, launched, client):
    suspend(alice, olivia)
    client.force_login(alice)

    page = text(client.get(reverse("instances:list")))

    assert page.count("It was stopped because your account was suspended.") == 2


def test_it_refuses_a_launch_in_the_service_and_says_why_on_the_page_before_the_click(
    alice, olivia, launched, client
):
    suspend(alice, olivia)

    with pytest.raises(ValidationError) as refused:
        instances.instance_launch(user=alice, size="1x", image_key="cpu")
    assert refused.value.messages == [NOTICE]
    assert Instance.objects.filter(user=alice).count() == 2

    client.force_login(alice)
    response = client.get(reverse("instances:list"))
    assert re.search(r'<button[^>]*data-testid="launch"[^>]*disabled', response.content.decode())
    assert NOTICE in text(response)
    assert not re.search(r'name="size" value="1x"\s+checked', response.content.decode())


# Transactional: the suspension commits from another connection.
@pytest.mark.django_db(transaction=True)
def test_a_launch_checked_just_before_the_suspension_committed_is_still_refused(monkeypatch):
    alice = make_user("alice@example.com", first_name="Alice")
    olivia = make_user("olivia@ops.example.com", staff=True, first_name="Olivia", last_name="Operator")
    give(alice, 25)
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    errors = []
    size_refusal = entitlements.size_refusal

    def suspend_from_another_connection():
        try:
            suspend(alice, olivia)
        except Exception as error:  # reported below: a thread's exception would vanish
            errors.append(error)
        finally:
            connection.close()

    def suspended_meanwhile(*args, **kwargs):
        # The launch has passed its first suspension check (alice is not suspended in its copy) and
        # has not taken the account lock yet: the operator's suspension commits right now.
        worker = threading.Thread(target=suspend_from_another_connection)
        worker.start()
        worker.join(30)
        return size_refusal(*args, **kwargs)

    monkeypatch.setattr(entitlements, "size_refusal", suspended_meanwhile)

    with pytest.raises(ValidationError) as refused:
        instances.instance_launch(user=alice, size="1x", image_key="cpu")

    assert errors == []
    assert refused.value.messages == [NOTICE]
    assert not Instance.objects.filter(user=alice).exists()


def test_it_refuses_a_launch_from_the_form(alice, olivia, launched, client):
    suspend(alice, olivia)
    client.force_login(alice)

    response = client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})

    assert response.status_code == 400
    assert NOTICE in text(response)
    assert Instance.objects.filter(user=alice).count() == 2


def test_it_refuses_a_bonus_application_with_the_reason(alice, olivia):
    program, _ = BonusProgram.objects.get_or_create(
        slug="rocm-star", defaults={"name": "ROCm Star developer certificate", "max_gpu_seconds": 50 * HOUR}
    )
    suspend(alice, olivia)

    with pytest.raises(ValidationError) as refused:
        credits.bonus_apply(user=alice, program=program, evidence="ROCM-STAR-0042")

    assert refused.value.messages == [NOTICE]
    assert not program.applications.exists()


def test_it_audits_and_emails_once_however_often_it_is_asked(
    alice, olivia, launched, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = suspend(alice, olivia)
        again = suspend(alice, olivia, reason="Another reason")

    assert again.suspended_at == first.suspended_at
    assert again.suspended_reason == "Crypto mining on the GPUs."
    entry = AuditEntry.objects.get(action="user.suspend")
    assert (entry.actor, entry.target_id, entry.reason) == (
        olivia,
        str(alice.pk),
        "Crypto mining on the GPUs.",
    )
    assert sorted(entry.details["instances_stopped"]) == sorted(str(i.id) for i in launched)
    # One email about the suspension, none per stopped instance.
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["alice@example.com"]
    assert "Crypto mining on the GPUs." in mail.outbox[0].body
    assert Notification.objects.filter(user=alice).count() == 1


def test_it_needs_a_reason(alice, olivia):
    with pytest.raises(ValidationError, match="Give the reason for the suspension"):
        suspend(alice, olivia, reason="   ")
    alice.refresh_from_db()
    assert not alice.is_suspended
    assert not AuditEntry.objects.exists()


def test_only_operators_suspend_and_not_themselves(alice, bob, olivia):
    with pytest.raises(PermissionDenied):
        suspend(alice, bob)
    with pytest.raises(PermissionDenied):
        suspend(olivia, olivia)
    assert not User.objects.filter(suspended_at__isnull=False).exists()


def test_a_suspended_user_still_logs_in_and_sees_their_balance(alice, olivia, client):
    give(alice, 25)
    suspend(alice, olivia)

    response = client.post(reverse("accounts:login"), {"username": "alice@example.com", "password": PASSWORD})

    assert response.status_code == 302
    page = text(client.get(reverse("instances:list")))
    assert "25.00" in page and NOTICE in page


def test_unsuspending_lets_them_launch_again_and_a_new_suspension_emails_again(
    alice, olivia, launched, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        suspend(alice, olivia)
        lifted = accounts.user_unsuspend(user=alice, actor=olivia, reason="Appeal accepted")
        accounts.user_unsuspend(user=alice, actor=olivia, reason="Twice")

    assert not lifted.is_suspended and lifted.suspended_reason == ""
    entry = AuditEntry.objects.get(action="user.unsuspend")
    assert entry.reason == "Appeal accepted"
    assert entry.details["suspended_reason"] == "Crypto mining on the GPUs."
    assert instances.instance_launch(user=alice, size="1x", image_key="cpu").state == Instance.State.QUEUED

    with django_capture_on_commit_callbacks(execute=True):
        suspend(alice, olivia, reason="Again")
    assert len(mail.outbox) == 2
    assert AuditEntry.objects.filter(action="user.suspend").count() == 2


def test_only_operators_unsuspend(alice, bob, olivia):
    suspend(alice, olivia)
    with pytest.raises(PermissionDenied):
        accounts.user_unsuspend(user=alice, actor=bob, reason="Friend")
    alice.refresh_from_db()
    assert alice.is_suspended


# --- The operator's buttons on the user page ---------------------------------------------------------


def user_page(user):
    return f"/admin/accounts/user/{user.pk}/change/"


def test_an_operator_suspends_and_unsuspends_from_the_user_page(
    alice, olivia_client, launched, django_capture_on_commit_callbacks
):
    page = olivia_client.get(user_page(alice))
    assert "Not suspended." in text(page)
    suspend_url = f"/admin/accounts/user/{alice.pk}/suspend/"
    assert suspend_url in page.content.decode()
    assert "2 live instance(s) will be stopped now" in text(olivia_client.get(suspend_url))

    with django_capture_on_commit_callbacks(execute=True):
        response = olivia_client.post(suspend_url, {"reason": "Crypto mining on the GPUs."}, follow=True)

    assert response.redirect_chain[-1][0] == user_page(alice)
    shown = text(response)
    assert "Suspended alice@example.com." in shown
    assert "Reason: Crypto mining on the GPUs." in shown
    assert f"/admin/accounts/user/{alice.pk}/unsuspend/" in response.content.decode()
    assert not Instance.objects.filter(user=alice, state__in=Instance.LIVE_STATES).exists()
    assert len(mail.outbox) == 1

    response = olivia_client.post(
        f"/admin/accounts/user/{alice.pk}/unsuspend/", {"reason": "Appeal accepted"}, follow=True
    )
    assert "Lifted the suspension of alice@example.com: they may launch again." in text(response)
    alice.refresh_from_db()
    assert not alice.is_suspended


def test_the_suspend_form_insists_on_a_reason(alice, olivia_client):
    response = olivia_client.post(f"/admin/accounts/user/{alice.pk}/suspend/", {"reason": ""})

    assert response.status_code == 200
    assert "Give a reason; it is kept in the audit log." in text(response)
    alice.refresh_from_db()
    assert not alice.is_suspended


def test_alice_cannot_reach_the_suspend_button(alice, bob, client):
    client.force_login(alice)

    response = client.post(f"/admin/accounts/user/{bob.pk}/suspend/", {"reason": "Mine now"})

    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    bob.refresh_from_db()
    assert not bob.is_suspended


def test_staff_without_the_change_permission_cannot_suspend(alice, client):
    oscar = User.objects.create_user("oscar@ops.example.com", PASSWORD, is_staff=True)
    client.force_login(oscar)

    response = client.post(f"/admin/accounts/user/{alice.pk}/suspend/", {"reason": "Because"})

    assert response.status_code == 403
    alice.refresh_from_db()
    assert not alice.is_suspended
