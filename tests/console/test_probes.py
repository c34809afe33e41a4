"""/healthz and /readyz: what a load balancer asks, by the machine's address, without logging in."""

import pytest
from django.test import Client

from tests.support.smtp import free_port


@pytest.fixture
def production_like(settings):
    """The host check and HTTPS redirect production has; probes arrive by IP over plain HTTP."""
    settings.ALLOWED_HOSTS = ["portal.example.com"]
    settings.SECURE_SSL_REDIRECT = True


def test_it_answers_liveness_without_a_database_or_login(client, production_like):
    response = client.get("/healthz", HTTP_HOST="10.0.0.5:8000")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_it_is_ready_when_postgresql_and_redis_answer_and_migrations_are_applied(client, production_like):
    response = client.get("/readyz", HTTP_HOST="10.0.0.5:8000")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ready"
    assert body["failed"] == []
    assert {name for name, check in body["checks"].items() if check["ok"]} == {
        "database",
        "redis",
        "migrations",
    }


@pytest.mark.django_db
def test_it_is_not_ready_when_redis_is_down_and_says_so_without_secrets(client, settings):
    # Nothing listens on this port; the URL carries a password that must never be shown.
    settings.CELERY_BROKER_URL = f"redis://:hunter2-broker-password@127.0.0.1:{free_port()}/0"

    response = client.get("/readyz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not ready"
    assert body["failed"] == ["redis"]
    assert body["checks"]["database"]["ok"] is True
    assert "hunter2" not in response.content.decode()
    assert "127.0.0.1" not in response.content.decode()


@pytest.mark.django_db
def test_it_is_not_ready_while_a_migration_is_pending(client, monkeypatch):
    from django.db.migrations.executor import MigrationExecutor

    from portal.console import health

    # As after a deploy that brought a migration nobody has applied yet.
    monkeypatch.setattr(health, "_migrations_applied", False)
    monkeypatch.setattr(
        MigrationExecutor,
        "migration_plan",
        lambda self, targets, clean_start=False: [("console.0099", False)],
    )

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["failed"] == ["migrations"]
    assert "not applied" in response.json()["checks"]["migrations"]["detail"]


def test_it_refuses_to_change_anything_through_a_probe(client):
    assert client.post("/healthz").status_code == 405


def test_it_serves_the_probes_from_the_asgi_application():
    """Through the same stack uvicorn serves (portal.asgi), not only Django's test client."""
    import asyncio

    import httpx

    from portal.asgi import application

    async def get():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://10.0.0.5") as client:
            return await client.get("/healthz")

    assert asyncio.run(get()).json() == {"status": "ok"}


def test_a_signed_in_page_still_needs_an_allowed_host(production_like):
    # The probes skip the host check; nothing else does.
    response = Client().get("/accounts/login/", HTTP_HOST="10.0.0.5:8000", secure=True)

    assert response.status_code == 400
