"""/metrics: Prometheus reads the fleet, queues, launches, beat work, credits, gateway and email figures,
and nobody else reads them."""

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import REGISTRY

from portal.console.models import PeriodicTaskRun
from portal.credits import services as credits
from portal.instances import services as instances
from portal.instances.models import Instance
from provisioning.drivers import fake
from provisioning.models import GpuHost
from tests.support.smtp import free_port

TOKEN = "metrics-token-for-tests-0123456789"
HOUR = 3600


@pytest.fixture
def token(settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOWED_NETWORKS = []
    return {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    """GET /metrics and return {(sample name, sorted labels): value}."""
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def counted(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_it_does_not_exist_until_a_token_or_network_is_configured(client, settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = []

    assert client.get("/metrics").status_code == 404


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x"])
def test_it_refuses_a_scraper_without_the_token(client, token, header):
    headers = {"HTTP_AUTHORIZATION": header} if header else {}

    response = client.get("/metrics", **headers)

    assert response.status_code == 401
    assert b"devcloud_" not in response.content


def test_it_refuses_an_address_outside_the_allowed_networks(client, settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = ["10.20.0.0/16"]

    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403


@pytest.mark.django_db
def test_it_serves_an_allowed_network_without_a_token(client, settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = ["10.20.0.0/16"]

    assert client.get("/metrics", REMOTE_ADDR="10.20.3.4").status_code == 200


@pytest.mark.django_db
def test_it_asks_for_both_when_both_are_set(client, settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOWED_NETWORKS = ["10.20.0.0/16"]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7", **auth).status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="10.20.3.4", **auth).status_code == 200


@pytest.fixture
def fleet(db, alice, bob):
    """Two hosts; alice runs on one GPU of gpu-01, bob waits in the queue since ten minutes."""
    busy = fake.make_host("gpu-01", gpus=8)
    fake.make_host("gpu-02", gpus=8, state=GpuHost.State.DOWN)
    GpuHost.objects.filter(pk=busy.pk).update(last_seen_at=timezone.now() - timedelta(seconds=90))
    image = fake.make_image("cpu")
    running = Instance.objects.create(
        user=alice,
        image=image,
        size="1x",
        state=Instance.State.RUNNING,
        host=busy,
        metered_until=timezone.now() - timedelta(seconds=75),
    )
    from provisioning.models import GpuAllocation

    GpuAllocation.objects.create(gpu=busy.gpus.first(), instance=running)
    queued = Instance.objects.create(user=bob, image=image, size="1x")
    Instance.objects.filter(pk=queued.pk).update(created_at=timezone.now() - timedelta(minutes=10))
    for user, hours in ((alice, 25), (bob, 5)):
        credits.credits_adjust(
            user=user, gpu_seconds=hours * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
        )
    return busy


def test_it_shows_gpus_by_host_and_state_instances_queue_and_heartbeats(client, token, fleet):
    samples = scrape(client, **token)

    assert samples[("devcloud_gpus", (("host", "gpu-01"), ("host_state", "active")))] == 8
    assert samples[("devcloud_gpus_allocated", (("host", "gpu-01"), ("host_state", "active")))] == 1
    assert samples[("devcloud_gpus", (("host", "gpu-02"), ("host_state", "down")))] == 8
    assert samples[("devcloud_hosts", (("state", "down"),))] == 1
    assert samples[("devcloud_instances", (("state", "running"),))] == 1
    assert samples[("devcloud_instances", (("state", "queued"),))] == 1
    assert samples[("devcloud_launch_queue_length", ())] == 1
    assert 590 <= samples[("devcloud_launch_queue_oldest_wait_seconds", ())] < 700
    assert 75 <= samples[("devcloud_meter_lag_seconds", ())] < 140
    heartbeat = samples[
        ("devcloud_host_heartbeat_age_seconds", (("host", "gpu-01"), ("host_state", "active")))
    ]
    assert 90 <= heartbeat < 150
    # gpu-02 has never answered: it has no age, and "host down" alerts go by its state.
    assert (
        "devcloud_host_heartbeat_age_seconds",
        (("host", "gpu-02"), ("host_state", "down")),
    ) not in samples


def test_it_shows_the_credits_burned_by_the_meter_tick(client, token, fleet, settings):
    from portal.celery import app

    before = scrape(client, **token)
    app.tasks["provisioning.meter_tick"].apply()
    after = scrape(client, **token)

    granted = ("devcloud_credits_granted_gpu_hours_total", ())
    burned = ("devcloud_credits_burned_gpu_hours_total", ())
    assert after[granted] == before[granted]
    # Alice ran 75 unbilled seconds on one GPU.
    assert after[burned] - before[burned] == pytest.approx(75 / HOUR, abs=30 / HOUR)


def test_it_records_when_each_beat_task_last_ran_and_how_long_it_took(client, token, fleet):
    from portal.celery import app

    tick_count = counted("devcloud_periodic_task_duration_seconds_count", task="provisioning.meter_tick")
    app.tasks["provisioning.meter_tick"].apply()
    app.tasks["provisioning.reconcile"].apply()
    samples = scrape(client, **token)

    now = timezone.now().timestamp()
    last = "devcloud_periodic_task_last_success_timestamp_seconds"
    assert now - 30 < samples[(last, (("task", "provisioning.meter_tick"),))] <= now
    assert now - 30 < samples[(last, (("task", "provisioning.reconcile"),))] <= now
    assert samples[(last, (("task", "provisioning.enforce_limits"),))] == 0  # never ran
    assert samples[("devcloud_periodic_task_period_seconds", (("task", "provisioning.meter_tick"),))] == 60
    assert (
        counted("devcloud_periodic_task_duration_seconds_count", task="provisioning.meter_tick")
        == tick_count + 1
    )
    assert PeriodicTaskRun.objects.get(task_name="provisioning.meter_tick").last_error == ""


def test_it_counts_what_the_reconciler_repaired(token, fleet, settings):
    from portal.celery import app

    settings.DEVCLOUD_DRIVER = "fake"
    fake.install()
    freed = counted("devcloud_reconciler_repairs_total", repair="vanished_failed")

    # alice's container is not on the (fake) host: the reconciler fails her instance and frees its GPU.
    app.tasks["provisioning.reconcile"].apply()

    assert counted("devcloud_reconciler_repairs_total", repair="vanished_failed") == freed + 1


@pytest.fixture
def gpu_01_with_cpu_image(cloud, settings, db):
    """On the fake cloud: host gpu-01 with 8 GPUs and the CPU image, and 20 s for a lab to become ready."""
    settings.READY_TIMEOUT_SECONDS = 20
    fake.make_host("gpu-01", gpus=8)
    fake.make_image("cpu")


def launched(user):
    credits.credits_adjust(
        user=user, gpu_seconds=25 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    instance = instances.instance_launch(user=user, size="1x", image_key="cpu")
    from portal.celery import app

    app.tasks["provisioning.provision_instance"].apply(kwargs={"instance_id": str(instance.id)})
    instance.refresh_from_db()
    return instance


def test_it_times_each_phase_of_a_launch_that_became_ready(alice, cloud, gpu_01_with_cpu_image):
    before = {
        phase: counted("devcloud_launch_duration_seconds_count", phase=phase)
        for phase in ("queued", "slot", "start", "ready", "total")
    }
    total_before = counted("devcloud_launch_duration_seconds_sum", phase="total")

    instance = launched(alice)

    assert instance.state == Instance.State.RUNNING
    for phase, count in before.items():
        assert counted("devcloud_launch_duration_seconds_count", phase=phase) == count + 1, phase
    took = (instance.ready_at - instance.created_at).total_seconds()
    assert counted("devcloud_launch_duration_seconds_sum", phase="total") - total_before == pytest.approx(
        took, abs=0.01
    )


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        ({"never_ready": True}, "ready_timeout"),
        ({"crash_on_start": True}, "container_exited"),
        ({"permanent_start_error": "No such image."}, "start_refused"),
    ],
)
def test_it_counts_failed_launches_by_reason(alice, cloud, gpu_01_with_cpu_image, settings, behaviour, reason):
    settings.READY_TIMEOUT_SECONDS = 1
    cloud.behave(**behaviour)
    before = counted("devcloud_launch_failures_total", reason=reason)

    instance = launched(alice)

    assert instance.state == Instance.State.FAILED
    assert counted("devcloud_launch_failures_total", reason=reason) == before + 1


def test_it_counts_email_sends_that_fail(charlie, settings):
    from portal.accounts.tasks import send_email
    from portal.celery import app

    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = (
        "127.0.0.1",
        free_port(),
        2,
    )  # nothing listens
    # As in a worker: a failure is handled by Celery (retried, then given up), not raised to the caller.
    propagates = app.conf.task_eager_propagates
    app.conf.task_eager_propagates = False
    retries = counted("devcloud_email_send_failures_total", task="accounts.send_email", outcome="retry")
    gave_up = counted("devcloud_email_send_failures_total", task="accounts.send_email", outcome="gave_up")

    # Inline, the retries run at once rather than spaced out; each one fails again.
    try:
        send_email.apply(kwargs={"kind": "verify", "user_id": charlie.pk})
    finally:
        app.conf.task_eager_propagates = propagates

    after_retries = counted("devcloud_email_send_failures_total", task="accounts.send_email", outcome="retry")
    assert after_retries == retries + send_email.max_retries
    assert (
        counted("devcloud_email_send_failures_total", task="accounts.send_email", outcome="gave_up")
        == gave_up + 1
    )


def test_it_times_gateway_requests_by_route():
    from portal.asgi import application

    before = counted("devcloud_gateway_request_duration_seconds_count", route="lab")

    async def get():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get(f"/instances/{uuid.uuid4()}/lab/api/status")

    assert asyncio.run(get()).status_code == 401  # no session
    assert counted("devcloud_gateway_request_duration_seconds_count", route="lab") == before + 1


def test_it_adds_up_counters_from_every_process_in_multiprocess_mode(tmp_path, monkeypatch):
    # Two other processes (a web worker and a Celery worker, say) each count one failed email.
    script = "from portal.console import metrics; metrics.EMAIL_FAILURES.labels('notifications.send', 'gave_up').inc()"
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-c", script],
            env={
                **os.environ,
                "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
                "DJANGO_SETTINGS_MODULE": "portal.settings.test",
            },
            check=True,
            timeout=60,
        )
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    from portal.console.metrics import StateCollector

    # The state read from the database is not what this test is about.
    monkeypatch.setattr(StateCollector, "collect", lambda self: iter(()))
    from portal.console import metrics

    text = metrics.exposition().decode()

    assert 'devcloud_email_send_failures_total{outcome="gave_up",task="notifications.send"} 2.0' in text


def test_it_counts_the_websockets_the_gateway_holds_open_and_forgets_them_when_closed():
    from portal.console.instrumentation import InstrumentedGateway

    async def lab(scope, receive, send):
        # A gateway that accepts the browser's websocket and relays until the browser leaves.
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass

    async def refusing_lab(scope, receive, send):
        await send({"type": "websocket.http.response.start", "status": 404, "headers": []})
        await send({"type": "websocket.http.response.body", "body": b""})

    async def session():
        before = counted("devcloud_gateway_open_websockets")
        leave = asyncio.Event()

        async def receive():
            await leave.wait()
            return {"type": "websocket.disconnect", "code": 1000}

        async def send(message):
            pass

        scope = {"type": "websocket", "path": f"/instances/{uuid.uuid4()}/lab/api/kernels/k/channels"}
        open_socket = asyncio.create_task(InstrumentedGateway(lab)(scope, receive, send))
        await asyncio.sleep(0.05)
        while_open = counted("devcloud_gateway_open_websockets")
        await InstrumentedGateway(refusing_lab)(scope, receive, send)
        after_refusal = counted("devcloud_gateway_open_websockets")
        leave.set()
        await open_socket
        return before, while_open, after_refusal, counted("devcloud_gateway_open_websockets")

    before, while_open, after_refusal, after = asyncio.run(session())

    assert while_open == before + 1
    assert after_refusal == before + 1  # a refused websocket was never open
    assert after == before
