"""The host console's engine calls (the engine check of the host form and of "Check the Docker engine
connection", GPU discovery, the host page's image list) run on the provisioning worker
(provisioning/console_calls.py): the web process, which has no Docker socket in production, never drives
an engine for them, and says so plainly when the worker does not answer."""

import os

import docker.api.client
import pytest
from django.urls import reverse

from portal.audit.models import AuditEntry
from provisioning import console_calls
from provisioning.models import GpuHost
from tests.support.worker import celery_publishing_to, celery_worker, redis_url, unique_queue

from .test_hosts import LOCAL_ENGINE
from .test_hosts_admin import ADD_URL, host_form

CHANGELIST_URL = "/admin/provisioning/gpuhost/"
OPS_REDIS_DB = int(os.environ.get("OPS_TEST_REDIS_DB", "13"))
SILENCE = "The provisioning worker did not answer within 1 s: is it running? `systemctl status devcloud-provisioning`"


def host_page(client, host) -> str:
    response = client.get(reverse("admin:provisioning_gpuhost_change", args=[host.pk]))
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def web_without_engines(monkeypatch):
    """This process, like the production web unit, cannot open any Docker engine: every client it makes
    fails the test. Only a worker process can reach one."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("the web process opened a Docker engine client")

    monkeypatch.setattr(docker.api.client.APIClient, "__init__", refuse)


@pytest.fixture
def no_worker_answers(settings, monkeypatch):
    """Tasks go to a real queue that no worker consumes; the console waits 1 s."""
    broker = redis_url(OPS_REDIS_DB)
    settings.REDIS_URL = broker
    for name in ("CHECK_SECONDS", "DISCOVER_SECONDS", "IMAGES_SECONDS"):
        monkeypatch.setattr(console_calls, name, 1)
    with celery_publishing_to(broker_url=broker, queue=unique_queue("console-nobody")):
        yield


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180, func_only=True)
def test_the_console_reaches_the_engine_only_through_the_provisioning_worker(
    settings, olivia_client, kfd_sysfs_2socket, web_without_engines
):
    broker = redis_url(OPS_REDIS_DB)
    default_queue, provisioning_queue = unique_queue("console-default"), unique_queue("console-provisioning")
    settings.REDIS_URL = broker
    settings.CELERY_PROVISIONING_QUEUE = provisioning_queue
    # The worker consumes only the provisioning queue: an answer proves the task was routed there.
    worker_env = {"CELERY_QUEUE": default_queue, "CELERY_PROVISIONING_QUEUE": provisioning_queue}
    with (
        celery_worker(queues=[provisioning_queue], broker_url=broker, extra_env=worker_env) as worker,
        celery_publishing_to(broker_url=broker, queue=default_queue),
    ):
        # Registration: the form's engine check, then the check that asks what it can limit, then discovery.
        added = olivia_client.post(ADD_URL, host_form(sysfs_root=str(kfd_sysfs_2socket)), follow=True)
        page = added.content.decode()
        assert "Not saved" not in page, page
        host = GpuHost.objects.get(name="gpu-01")
        assert host.gpus.filter(is_present=True).count() == 8
        assert host.last_seen_at is not None and host.can_limit_workspaces is not None

        images = host_page(olivia_client, host)
        checked = olivia_client.post(
            CHANGELIST_URL, {"action": "check_engines", "_selected_action": [host.pk]}, follow=True
        ).content.decode()
        log = worker.log()

    assert 'data-testid="images-error"' not in images
    assert "Docker " in checked and " answered." in checked
    assert AuditEntry.objects.filter(action="host.check", target_repr="gpu-01").exists()
    for task in ("engine_ping", "host_check", "host_discover", "host_images"):
        assert f"provisioning.console_{task}" in log, log


@pytest.mark.django_db
def test_without_a_worker_check_engine_says_so_plainly(olivia_client, no_worker_answers):
    host = GpuHost.objects.create(name="gpu-quiet", docker_url=LOCAL_ENGINE)

    response = olivia_client.post(
        CHANGELIST_URL, {"action": "check_engines", "_selected_action": [host.pk]}, follow=True
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert f"Gpu-quiet: {SILENCE}" in page
    assert "Traceback" not in page
    [entry] = AuditEntry.objects.filter(action="host.check")
    assert "did not answer" in entry.details["error"]


@pytest.mark.django_db
def test_without_a_worker_the_host_page_still_renders_and_says_why_it_has_no_image_list(
    olivia_client, no_worker_answers
):
    host = GpuHost.objects.create(name="gpu-quiet", docker_url=LOCAL_ENGINE)

    page = host_page(olivia_client, host)

    assert f"This host's images could not be read: {SILENCE}" in page


@pytest.mark.django_db
def test_without_a_worker_discovery_and_registration_say_so_and_save_nothing(
    olivia_client, no_worker_answers, kfd_sysfs_2socket
):
    host = GpuHost.objects.create(name="gpu-quiet", docker_url=LOCAL_ENGINE)

    discovered = olivia_client.post(
        CHANGELIST_URL, {"action": "discover_gpus", "_selected_action": [host.pk]}, follow=True
    ).content.decode()
    added = olivia_client.post(ADD_URL, host_form(name="gpu-new", sysfs_root=str(kfd_sysfs_2socket)))

    assert f"Gpu-quiet: {SILENCE}" in discovered
    assert added.status_code == 200
    assert f"Not saved: {SILENCE}" in added.content.decode()
    assert not GpuHost.objects.filter(name="gpu-new").exists()


@pytest.mark.django_db
def test_with_the_task_queue_down_the_console_says_so(olivia_client, settings, monkeypatch):
    host = GpuHost.objects.create(name="gpu-quiet", docker_url=LOCAL_ENGINE)

    with celery_publishing_to(broker_url="redis://127.0.0.1:1/0", queue=unique_queue("console-down")):
        page = host_page(olivia_client, host)

    assert "This host's images could not be read: Could not ask the provisioning worker: the task queue" in page
