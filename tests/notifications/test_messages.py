"""Every kind's email says what happened and what the user can do, with links into the portal."""

import pytest
from django.conf import settings
from django.utils import timezone

from portal.credits import services as credit_services
from portal.credits.models import BonusProgram
from portal.notifications import services
from portal.notifications.models import Kind
from portal.notifications.services import StopReason
from tests.conftest import give, mails_to

from .conftest import make_instance, spend_to

pytestmark = pytest.mark.django_db


@pytest.fixture
def send_now(django_capture_on_commit_callbacks):
    """Run `make` as a caller would inside its transaction, commit, and return the one email it sent."""

    def send(make, outbox, user):
        with django_capture_on_commit_callbacks(execute=True):
            notification = make()
        assert notification is not None
        [message] = mails_to(outbox, user)
        return notification, message

    return send


@pytest.fixture
def decision_email(mailoutbox, django_capture_on_commit_callbacks):
    """Take an operator's decision on a bonus application and return the one email it sent `user`.

    The credits service notifies the applicant itself; reporting the decision again here must send
    nothing more.
    """

    def decide(take_decision, user):
        before = len(mails_to(mailoutbox, user))
        with django_capture_on_commit_callbacks(execute=True):
            application = take_decision()
        with django_capture_on_commit_callbacks(execute=True):
            services.notify_bonus_decided(application=application)
        [message] = mails_to(mailoutbox, user)[before:]
        return message

    return decide


def assert_says(message, *, subject, body):
    for phrase in subject:
        assert phrase in message.subject, (phrase, message.subject)
    for phrase in body:
        assert phrase in message.body, (phrase, message.body)


@pytest.mark.parametrize(
    "reason, extra, subject, body",
    [
        (
            StopReason.CREDITS_EXHAUSTED,
            {},
            ["was stopped", "credits ran out"],
            ["Your GPU credit ran out", "Get more GPU-hours", "/bonus/", "launch again"],
        ),
        (
            StopReason.IDLE,
            {"idle_minutes": 60},
            ["stopped because it was idle"],
            [
                "was idle for 60 minutes",
                "Launch again when you need it",
                "a busy kernel or a busy GPU counts",
            ],
        ),
        (
            StopReason.MAX_LENGTH,
            {"max_hours": 12},
            ["maximum session length"],
            ["maximum session length of 12 hours", "Launch again to continue", "checkpoints"],
        ),
        (
            StopReason.OPERATOR,
            {"operator_reason": "Host gpu-7 is going down for maintenance."},
            ["stopped by an operator"],
            ["Reason given: Host gpu-7 is going down for maintenance.", "contact the DevCloud operators"],
        ),
    ],
)
def test_it_explains_each_stop_and_what_to_do(
    alice, image, mailoutbox, send_now, reason, extra, subject, body
):
    instance = make_instance(alice, image)

    _, message = send_now(
        lambda: services.notify_instance_stopped(instance=instance, reason=reason, **extra), mailoutbox, alice
    )

    assert_says(message, subject=[instance.short_id, *subject], body=body)
    assert "Your files in /workspace are kept" in message.body
    assert f"{settings.SITE_URL}/instances/{instance.id}/" in message.body
    assert f"{settings.SITE_URL}/instances/" in message.body
    assert message.body.startswith("Hello Alice,")
    # Mandatory: no "turn these off" line.
    assert "/notifications/preferences/" not in message.body


def test_it_explains_an_idle_warning_and_how_to_keep_the_instance(alice, image, mailoutbox, send_now):
    instance = make_instance(alice, image)

    _, message = send_now(
        lambda: services.notify_instance_idle_warning(
            instance=instance, idle_since=timezone.now(), idle_minutes=50, grace_minutes=10
        ),
        mailoutbox,
        alice,
    )

    assert_says(
        message,
        subject=["is idle and will be stopped in 10 minutes"],
        body=["idle for 50 minutes", "To keep it, open JupyterLab and run something", "Stop it now"],
    )


def test_it_passes_on_the_launch_failure_reason(alice, image, mailoutbox, send_now):
    instance = make_instance(
        alice, image, state="failed", failure_reason="JupyterLab did not answer within 180 seconds."
    )

    _, message = send_now(lambda: services.notify_launch_failed(instance=instance), mailoutbox, alice)

    assert_says(
        message,
        subject=["Your launch of", instance.short_id, "failed"],
        body=[
            "What went wrong: JupyterLab did not answer within 180 seconds.",
            "no credit was used",
            "Launch again",
            "try another image or size",
        ],
    )


def test_it_tells_an_approved_applicant_how_many_hours_they_got(alice, olivia, decision_email):
    program = BonusProgram.objects.get(slug="rocm-star")
    application = credit_services.bonus_apply(user=alice, program=program, evidence="ROCM-STAR-1")

    message = decision_email(
        lambda: credit_services.bonus_approve(application_id=application.pk, actor=olivia), alice
    )

    assert_says(
        message,
        subject=["ROCm Star developer certificate application was approved", "50.00 GPU-hours added"],
        body=["50.00 GPU-hours were added to your balance", "Launch an instance"],
    )


def test_it_says_when_the_bonus_cap_cut_the_grant(alice, olivia, decision_email):
    program = BonusProgram.objects.create(name="Hackathon", slug="hackathon", max_gpu_seconds=40 * 3600)
    first = credit_services.bonus_apply(user=alice, program=program, evidence="HACK-1")
    credit_services.bonus_approve(application_id=first.pk, actor=olivia)
    rocm = BonusProgram.objects.get(slug="rocm-star")
    second = credit_services.bonus_apply(user=alice, program=rocm, evidence="ROCM-STAR-1")

    message = decision_email(
        lambda: credit_services.bonus_approve(application_id=second.pk, actor=olivia), alice
    )

    assert "10.00 GPU-hours added" in message.subject
    assert "bonus hours are capped per person" in message.body


def test_it_gives_a_rejected_applicant_the_reason_and_a_way_to_apply_again(alice, olivia, decision_email):
    program = BonusProgram.objects.get(slug="rocm-star")
    application = credit_services.bonus_apply(user=alice, program=program, evidence="ROCM-STAR-X")

    message = decision_email(
        lambda: credit_services.bonus_reject(
            application_id=application.pk,
            actor=olivia,
            reason="Certificate ID not found in the ROCm Star register.",
        ),
        alice,
    )

    assert_says(
        message,
        subject=["ROCm Star developer certificate application was not approved"],
        body=[
            "Reason: Certificate ID not found in the ROCm Star register.",
            "apply again",
            f"{settings.SITE_URL}/bonus/",
        ],
    )


def test_it_tells_a_suspended_user_why_and_what_is_kept(alice, mailoutbox, send_now):
    _, message = send_now(
        lambda: services.notify_account_suspended(
            user=alice, reason="Crypto mining is not allowed.", suspended_at=timezone.now()
        ),
        mailoutbox,
        alice,
    )

    assert_says(
        message,
        subject=["Your DevCloud account is suspended"],
        body=[
            "Reason: Crypto mining is not allowed.",
            "cannot launch new ones",
            "Your credits and your files in /workspace are kept",
            "contact the DevCloud operators",
        ],
    )


@pytest.mark.parametrize(
    "balance_minutes, subject, body",
    [
        (
            50,
            ["About 1 hour of GPU credit left"],
            ["0.83 GPU-hours are left", "lasts about 50 minutes", "one more warning"],
        ),
        (
            8,
            ["About 10 minutes of GPU credit left"],
            ["0.13 GPU-hours are left", "lasts about 8 minutes", "Save your notebooks"],
        ),
    ],
)
def test_it_warns_about_low_credit_with_the_runway_and_an_off_switch(
    alice, mailoutbox, send_now, balance_minutes, subject, body
):
    give(alice, 5)
    balance = spend_to(alice, balance_minutes * 60)

    _, message = send_now(
        lambda: services.credit_warnings_check(
            user=alice, balance_gpu_seconds=balance, burn_gpu_seconds_per_hour=3600
        ),
        mailoutbox,
        alice,
    )

    assert_says(
        message, subject=subject, body=[*body, "the instances you no longer need", "1 GPU-hour per hour"]
    )
    # Optional: the email says how to turn these off.
    assert f"{settings.SITE_URL}/notifications/preferences/" in message.body


def test_it_writes_plain_text_without_html_escaping(alice, image, mailoutbox, send_now):
    instance = make_instance(alice, image)

    _, message = send_now(
        lambda: services.notify_instance_stopped(
            instance=instance,
            reason=StopReason.OPERATOR,
            operator_reason="Abuse report <ticket #12> & follow-up",
        ),
        mailoutbox,
        alice,
    )

    assert "Reason given: Abuse report <ticket #12> & follow-up" in message.body


@pytest.mark.parametrize(
    "kind, context, error",
    [
        ("no_such_kind", {}, "is not a valid Kind"),
        (Kind.INSTANCE_STOPPED, {"instance_id": "x", "instance_label": "x"}, "needs reason"),
        (
            Kind.INSTANCE_STOPPED,
            {"instance_id": "x", "instance_label": "x", "reason": "bored"},
            "Unknown stop reason",
        ),
        (
            Kind.INSTANCE_STOPPED,
            {"instance_id": "x", "instance_label": "x", "reason": "operator"},
            "operator's reason",
        ),
        (
            Kind.BONUS_DECISION,
            {"program": "ROCm Star", "approved": False},
            "rejected bonus application needs",
        ),
        (Kind.ACCOUNT_SUSPENDED, {"reason": ""}, "needs reason"),
    ],
)
def test_it_refuses_a_call_its_templates_cannot_explain(alice, mailoutbox, kind, context, error):
    with pytest.raises(ValueError, match=error):
        services.notify(user=alice, kind=kind, event_key="test:1", context=context)

    assert not alice.notifications.exists()
    assert mailoutbox == []


def test_it_does_not_promise_the_files_back_when_their_host_went_down(alice, image, mailoutbox, send_now):
    instance = make_instance(alice, image)

    _, message = send_now(
        lambda: services.notify_instance_stopped(instance=instance, reason=StopReason.HOST_DOWN),
        mailoutbox,
        alice,
    )

    assert "stopped answering" in message.body
    assert "come back when you launch again" not in message.body
    assert "Your files in /workspace stay on that host" in message.body
    assert "If it comes back, they follow your next launch" in message.body
    assert "if the host never comes back, those files are lost" in message.body
