"""A host's images in the console: the catalogue against what the host's real Docker engine has, and
pre-pull or build jobs whose progress the page polls, with failures that say what to do."""

import os
import re
import threading
import time
import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.urls import reverse

from portal.audit.models import AuditEntry
from portal.instances import catalog as catalog_module
from portal.instances.catalog import load_catalog
from portal.instances.models import Image
from provisioning import images, tasks
from provisioning.models import GpuHost, ImageJob
from tests.support.docker_instances import LOCAL_ENGINE, docker_client
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)

from .test_hosts import closed_port, unreachable_tls_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

CHANGELIST_URL = "/admin/provisioning/gpuhost/"


def make_host(name, docker_url=LOCAL_ENGINE):
    return GpuHost.objects.create(name=name, docker_url=docker_url)


def make_image(key, reference, *, build_context="", enabled=True):
    return Image.objects.create(
        key=key,
        name=key.title(),
        sizes=["1x"],
        reference=reference,
        build_context=build_context,
        is_enabled=enabled,
        needs_gpu=False,
    )


def host_page(client, host) -> str:
    return client.get(reverse("admin:provisioning_gpuhost_change", args=[host.pk])).content.decode()


def row_of(page, image_key) -> str:
    return page.split(f'<tr data-image="{image_key}">', 1)[1].split("</tr>", 1)[0]


def status_json(client, **query):
    response = client.get(reverse("admin:provisioning_gpuhost_image_jobs_status"), query)
    assert response.status_code == 200
    return response.json()["jobs"]


# --- What the host has ----------------------------------------------------------------------------------


def test_the_host_page_lists_catalogue_images_as_present_or_missing(olivia_client, db, cpu_image):
    host = make_host("gpu-local")
    make_image("cpu", cpu_image, build_context="cpu")
    make_image("ghost", f"devcloud/ghost:{uuid.uuid4().hex[:12]}")
    make_image("retired", "devcloud/retired:old", enabled=False)
    # An earlier build of the cpu image, as a host keeps it after the catalogue moved on.
    older = f"{cpu_image.rsplit(':', 1)[0]}:older-{uuid.uuid4().hex[:8]}"
    docker_client().images.get(cpu_image).tag(older)
    try:
        page = host_page(olivia_client, host)
    finally:
        docker_client().images.remove(older)

    assert "present" in row_of(page, "cpu") and "missing" not in row_of(page, "cpu")
    assert "missing" in row_of(page, "ghost")
    assert "Pre-pull or build here" in row_of(page, "ghost")
    assert 'data-image="retired"' not in page
    earlier = page.split("Earlier builds of catalogue images on this host", 1)[1].split("</p>", 1)[0]
    assert f"<code>{older}</code>" in earlier and cpu_image not in earlier


def test_the_host_page_says_why_it_cannot_list_images_of_an_engine_that_does_not_answer(olivia_client, db, host_pki):
    engine = unreachable_tls_engine(host_pki)
    url = engine["docker_url"]
    host = GpuHost.objects.create(name="gpu-gone", **engine)

    page = host_page(olivia_client, host)

    assert (
        f"This host's images could not be read: Cannot reach the Docker engine at {url}: Connection refused" in page
    )


# --- Jobs -----------------------------------------------------------------------------------------------


def test_an_operator_puts_an_image_on_several_hosts_and_each_job_reports_what_it_did(
    olivia_client, olivia, db, cpu_image, django_capture_on_commit_callbacks
):
    hosts = [make_host("gpu-a"), make_host("gpu-b"), make_host("gpu-old")]
    GpuHost.objects.filter(name="gpu-old").update(state=GpuHost.State.RETIRED)
    image = make_image("cpu", cpu_image, build_context="cpu")

    chooser = olivia_client.post(
        CHANGELIST_URL,
        {"action": "ensure_image_on_hosts", "index": "0", "_selected_action": [h.pk for h in hosts]},
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = olivia_client.post(
            CHANGELIST_URL,
            {
                "action": "ensure_image_on_hosts",
                "_selected_action": [h.pk for h in hosts],
                "image": image.pk,
                "reason": "Before the workshop",
                "_confirm": "1",
            },
        )

    assert "gpu-old (retired: skipped)" in chooser.content.decode()
    assert response.status_code == 302
    jobs = list(ImageJob.objects.order_by("host__name"))
    assert [job.host.name for job in jobs] == ["gpu-a", "gpu-b"]
    for job in jobs:
        assert (job.state, job.outcome, job.percent) == ("done", "present", 100)
        assert f"{cpu_image} is already on {job.host.name}" in job.progress_text
    progress_page = olivia_client.get(response["Location"]).content.decode()
    assert 'id="image-jobs"' in progress_page and "fetch(root.dataset.statusUrl" in progress_page
    entries = AuditEntry.objects.filter(action="host.image").order_by("target_repr")
    assert [(e.target_repr, e.reason, e.details["image"]) for e in entries] == [
        ("gpu-a", "Before the workshop", "cpu"),
        ("gpu-b", "Before the workshop", "cpu"),
    ]


@pytest.fixture
def slow_catalogue(tmp_path, monkeypatch, cpu_image):
    """A catalogue with one image whose build takes a few seconds (a unique RUN, so never cached), FROM the
    real local Debian base. The portal reads it instead of containers/catalog.toml. Yields its reference;
    the built image is removed afterwards."""
    base = load_catalog().base
    containers = tmp_path / "containers"
    (containers / "slow").mkdir(parents=True)
    marker = uuid.uuid4().hex
    (containers / "slow" / "Dockerfile").write_text(
        f"ARG BASE\nFROM ${{BASE}}\nRUN echo starting {marker}\nRUN sleep 3 && echo slept {marker}\n"
        "LABEL devcloud.test=hosts-console\n"
    )
    (containers / "catalog.toml").write_text(
        f"""
[base]
repository = "{base.repository}"
suite = "{base.suite}"
variant = "{base.variant}"
arch = "{base.arch}"

[images.slow]
name = "Slow"
sizes = ["1x"]
context = "slow"
base = "debian"
repository = "devcloud/test-hosts-slow"
"""
    )
    monkeypatch.setattr(catalog_module, "CATALOG_PATH", containers / "catalog.toml")
    reference = load_catalog().reference("slow")
    yield reference
    client = docker_client()
    if any(reference in image.tags for image in client.images.list(name="devcloud/test-hosts-slow")):
        client.images.remove(reference, force=True)


# The job runs in a thread of its own, as on a worker: it sees only committed rows.
@pytest.mark.django_db(transaction=True)
def test_a_build_shows_its_progress_while_it_runs(olivia, slow_catalogue):
    host = make_host("gpu-build")
    image = make_image("slow", slow_catalogue, build_context="slow")
    job = ImageJob.objects.create(host=host, image=image, reference=image.reference)
    client = Client()
    client.force_login(olivia)

    def work():
        # What a worker does with the message the action publishes.
        try:
            tasks.ensure_image.apply(kwargs={"host_id": host.pk, "image_key": "slow", "job_id": job.pk})
        finally:
            connection.close()

    worker = threading.Thread(target=work)

    worker.start()
    seen_running = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        [status] = status_json(client, host=host.pk)
        steps = [line for line in status["progress_text"].splitlines() if line.startswith("Step ")]
        if seen_running is None and status["state"] == "running" and steps and "sleep 3" in steps[-1]:
            seen_running = status
        if not status["active"]:
            break
        time.sleep(0.1)
    worker.join(timeout=60)

    # While it ran, the poll saw the build step it was on and how far along that is.
    assert seen_running is not None, status
    last_step = [line for line in seen_running["progress_text"].splitlines() if line.startswith("Step ")][-1]
    step, steps = re.match(r"Step (\d+)/(\d+) : RUN sleep 3", last_step).groups()
    assert seen_running["percent"] == (int(step) - 1) * 100 // int(steps)  # the steps before it are done
    assert 0 < seen_running["percent"] < 100
    assert (status["state"], status["outcome"], status["percent"]) == ("done", "built", 100)
    assert f"built {slow_catalogue}" in status["progress_text"]
    assert slow_catalogue in docker_client().images.get(slow_catalogue).tags


def test_a_job_for_an_image_no_registry_serves_fails_and_says_what_to_do(
    olivia, db, django_capture_on_commit_callbacks
):
    host = make_host("gpu-pull")
    # A registry on loopback that is not there: the engine's pull fails at once, with no outside traffic.
    reference = f"127.0.0.1:{closed_port()}/devcloud/ghost:missing"
    image = make_image("ghost", reference)

    with django_capture_on_commit_callbacks(execute=True):
        [job] = images.image_jobs_request(hosts=[host], image=image, actor=olivia)

    job.refresh_from_db()
    assert job.state == "failed" and job.finished_at is not None
    assert "connection refused" in job.error
    assert (
        "Check that the reference in containers/catalog.toml names an image its registry serves" in job.error
    )
    assert f"pulling {reference} on gpu-pull" in job.progress_text


def test_a_job_for_a_reference_the_catalogue_no_longer_builds_says_to_sync(
    olivia, db, django_capture_on_commit_callbacks
):
    host = make_host("gpu-stale")
    image = make_image("cpu", "devcloud/cpu:stale-tag", build_context="cpu")

    with django_capture_on_commit_callbacks(execute=True):
        [job] = images.image_jobs_request(hosts=[host], image=image, actor=olivia)

    job.refresh_from_db()
    assert job.state == "failed"
    assert "not devcloud/cpu:stale-tag" in job.error
    assert "Run `manage.py sync_images`, then build again." in job.error


def test_asking_again_while_a_job_runs_returns_that_job_and_a_silent_one_is_replaced(olivia, db):
    host = make_host("gpu-busy")
    image = make_image("cpu", "devcloud/cpu:whatever", build_context="cpu")
    running = ImageJob.objects.create(host=host, image=image, reference=image.reference, state="running")

    assert images.image_jobs_request(hosts=[host], image=image, actor=olivia) == [running]

    ImageJob.objects.filter(pk=running.pk).update(updated_at=running.updated_at - images.STALE_AFTER * 2)
    [replacement] = images.image_jobs_request(hosts=[host], image=image, actor=olivia)
    running.refresh_from_db()
    assert replacement.pk != running.pk and replacement.state == "queued"
    assert running.state == "failed" and "a new job replaced it" in running.error


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed")
@pytest.mark.django_db(transaction=True)
def test_the_progress_page_updates_in_the_browser_without_a_reload(olivia, live_server, slow_catalogue):
    from playwright.sync_api import sync_playwright

    host = make_host("gpu-watch")
    image = make_image("slow", slow_catalogue, build_context="slow")
    job = ImageJob.objects.create(host=host, image=image, reference=image.reference)
    client = Client()
    client.force_login(olivia)
    session_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    url = live_server.url + reverse("admin:provisioning_gpuhost_image_jobs") + f"?ids={job.pk}"
    row = f'tr[data-job="{job.pk}"]'

    def work():
        try:
            tasks.ensure_image.apply(kwargs={"host_id": host.pk, "image_key": "slow", "job_id": job.pk})
        finally:
            connection.close()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.add_cookies(
                [{"name": settings.SESSION_COOKIE_NAME, "value": session_key, "url": live_server.url}]
            )
            page = context.new_page()
            page.goto(url)
            assert page.locator(f'{row} [data-field="state"]').inner_text() == "Queued"
            worker = threading.Thread(target=work)
            worker.start()
            # The page was loaded once; what follows arrives through its poll.
            page.wait_for_function(
                f"document.querySelector('{row} [data-field=\"progress\"]').textContent.includes('RUN sleep 3')",
                timeout=60_000,
            )
            running_state = page.locator(f'{row} [data-field="state"]').inner_text()
            page.wait_for_function(
                f"document.querySelector('{row} [data-field=\"state\"]').textContent === 'Done (built)'",
                timeout=60_000,
            )
            percent = page.locator(f'{row} [data-field="percent-text"]').inner_text()
            worker.join(timeout=60)
        finally:
            browser.close()

    assert running_state == "Running"
    assert percent == "100%"


@pytest.mark.django_db(transaction=True)
def test_a_new_host_gets_the_enabled_catalogue_images_it_lacks_put_onto_it_with_a_job_each(cpu_image, olivia):
    host = make_host("gpu-new")
    present = make_image("present", cpu_image)
    missing = make_image("missing", f"devcloud/missing:{uuid.uuid4().hex[:12]}")
    make_image("switched-off", "devcloud/off:test", enabled=False)

    jobs = images.host_images_prefetch(host=host, actor=olivia)

    assert [job.image for job in jobs] == [missing]
    assert not ImageJob.objects.filter(image=present).exists()
    assert AuditEntry.objects.filter(action="host.image", target_id=str(host.pk)).count() == 1
    # What the host has is remembered, so placement and the launch page need not ask the engine.
    assert host.host_images.get(reference=cpu_image).present
    assert not host.host_images.get(reference=missing.reference).present
