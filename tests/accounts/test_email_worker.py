"""The verification email goes through a real Celery worker, over real Redis, to a real SMTP server."""

import os

import pytest
from django.test import Client, override_settings

from portal.accounts.models import User
from portal.credits.selectors import balance_for
from tests.conftest import PASSWORD
from tests.support.smtp import smtp_server
from tests.support.worker import celery_publishing_to, celery_worker, redis_url, unique_queue

from .conftest import link_path

# Redis database index used by the accounts tests only.
REDIS_DB = int(os.environ.get("ACCT_TEST_REDIS_DB", "11"))


@pytest.mark.slow
# Transactional: the worker only sees committed rows. The grant program it needs is re-created by the
# autouse `signup_program` fixture, as the flush after an earlier transactional test removes seeded rows.
@pytest.mark.django_db(transaction=True)
def test_it_sends_the_verification_email_from_a_real_worker_and_the_link_grants_25_hours():
    broker = redis_url(REDIS_DB)
    queue = unique_queue("acct-email")
    with smtp_server() as (inbox, port):
        worker_env = {
            "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(port),
            "EMAIL_USE_TLS": "0",
        }
        with celery_worker(queues=[queue], broker_url=broker, extra_env=worker_env) as worker:
            with (
                override_settings(CELERY_TASK_ALWAYS_EAGER=False),
                celery_publishing_to(broker_url=broker, queue=queue),
            ):
                browser = Client()
                response = browser.post(
                    "/accounts/signup/",
                    {"email": "dana@example.com", "password": PASSWORD, "password_confirm": PASSWORD},
                )
                assert response.status_code == 200

                mail = inbox.wait_for(lambda message: "dana@example.com" in message.rcpt_tos, timeout=30)

            assert "Confirm your email address" in mail.subject
            assert "accounts.send_email" in worker.log()

    response = browser.post(link_path(mail.body), {"password": PASSWORD}, follow=True)

    assert "25.00 GPU-hours were added to your balance." in response.content.decode()
    dana = User.objects.get(email="dana@example.com")
    assert dana.email_verified
    assert balance_for(dana) == 25 * 3600
