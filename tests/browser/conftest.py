"""Browser journey fixtures: the whole portal for real on loopback.

A web process (uvicorn, portal.asgi), a Celery worker, a local SMTP server, the Docker engine with the CPU
image, and a GPU host registered from the 8-GPU KFD fixture with stand-in device nodes. Everything made
on the engine carries this test's own portal id (DEVCLOUD_PORTAL_ID) and is removed afterwards; the
broker is Redis db BROWSER_TEST_REDIS_DB (8 by default) with a queue of the test's own.
"""

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from portal.instances.catalog import catalog_sync
from portal.instances.models import Image
from provisioning import services as hosts
from provisioning.inventory import read_inventory
from provisioning.models import GpuHost
from tests.conftest import KFD_FIXTURES, make_kfd_dev_root
from tests.support.docker_instances import LOCAL_ENGINE, remove_portal_objects
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)
from tests.support.smtp import CollectingHandler, free_port, smtp_server
from tests.support.worker import Worker, celery_worker, current_database_url, redis_url, unique_queue

from .stack import PortalProcess, collect_static, stack_env

BROWSER_REDIS_DB = int(os.environ.get("BROWSER_TEST_REDIS_DB", "8"))
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "journey"
KFD_8GPU = KFD_FIXTURES / "mi300x-8gpu"


@dataclass
class Stack:
    url: str
    web: PortalProcess
    worker: Worker
    mailbox: CollectingHandler


@pytest.fixture
def artifacts() -> Path:
    """tests/artifacts/journey/, emptied: screenshots and the processes' logs of the last run."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def static_root(tmp_path_factory) -> Path:
    return collect_static(tmp_path_factory.mktemp("static"))


@pytest.fixture
def journey_portal_id(settings):
    """This test's portal id; whatever the engine holds under it is removed afterwards."""
    portal_id = f"test-browser-{uuid.uuid4().hex[:10]}"
    settings.DEVCLOUD_PORTAL_ID = portal_id
    yield portal_id
    remove_portal_objects(portal_id)


@pytest.fixture
def gpu_host(transactional_db, tmp_path) -> GpuHost:
    """The 8-GPU fixture host on the local engine, registered as an operator does (engine checked, GPUs
    discovered from KFD sysfs), with stand-in /dev nodes for its render minors."""
    if os.geteuid() != 0:
        pytest.skip("creating device nodes (mknod) needs root")
    minors = [gpu.drm_render_minor for gpu in read_inventory(KFD_8GPU)]
    dev_root = make_kfd_dev_root(tmp_path / "host-dev", minors)
    return hosts.host_register(
        name="gpu-browser-01", docker_url=LOCAL_ENGINE, sysfs_root=str(KFD_8GPU), dev_root=str(dev_root.path)
    )


@pytest.fixture
def cpu_catalog(transactional_db, cpu_image) -> Image:
    """The image catalogue loaded as `manage.py sync_images` does; the cpu image is the one just built."""
    catalog_sync()
    image = Image.objects.get(key="cpu")
    assert image.reference == cpu_image
    return image


@pytest.fixture
def portal_stack(transactional_db, journey_portal_id, static_root, artifacts, tmp_path):
    """The web process and a worker sharing a queue, a database and an SMTP server. Their logs are kept
    in tests/artifacts/journey/ (web.log, worker.log)."""
    port = free_port()
    site_url = f"http://127.0.0.1:{port}"
    broker_url = redis_url(BROWSER_REDIS_DB)
    queue = unique_queue("browser")
    with smtp_server() as (mailbox, smtp_port):
        env = stack_env(
            portal_id=journey_portal_id,
            database_url=current_database_url(),
            broker_url=broker_url,
            queue=queue,
            site_url=site_url,
            smtp_port=smtp_port,
            static_root=static_root,
        )
        with celery_worker(queues=[queue], broker_url=broker_url, extra_env=env) as worker:
            web = PortalProcess(port=port, env=env, log_path=tmp_path / "web.log")
            try:
                web.start()
                yield Stack(url=site_url, web=web, worker=worker, mailbox=mailbox)
            finally:
                # Both stop before the test database is flushed, which their open connections would block.
                web.stop()
                (artifacts / "web.log").write_text(web.log())
                (artifacts / "worker.log").write_text(worker.log())
