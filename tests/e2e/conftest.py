"""End-to-end fixtures: everything real. The Docker engine, PostgreSQL, Redis (db E2E_TEST_REDIS_DB, a queue
of each test's own), a Celery worker subprocess, the gateway (uvicorn in a thread) and the CPU image built
by scripts/build-images.sh.

Each test gets a portal id of its own (DEVCLOUD_PORTAL_ID, in this process and its workers), so whatever
it makes on the engine is labelled with it, and only that is removed afterwards.
"""

import json
import os
import uuid
from contextlib import contextmanager

import kombu.pools
import pytest
import redis
from django.test import override_settings

from portal.instances.catalog import catalog_sync
from portal.instances.models import Image
from tests.gateway.helpers import ServerThread
from tests.support.docker_instances import remove_portal_objects
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)
from tests.support.worker import celery_publishing_to, celery_worker, redis_url, unique_queue

from .helpers import is_root, stand_in_dev_root, worker_env

# Redis database index of the e2e tests only.
E2E_REDIS_DB = int(os.environ.get("E2E_TEST_REDIS_DB", "9"))


@pytest.fixture
def e2e_portal(settings):
    """This test's portal id; everything labelled with it is removed from the engine afterwards."""
    portal_id = f"test-e2e-{uuid.uuid4().hex[:10]}"
    settings.DEVCLOUD_PORTAL_ID = portal_id
    settings.DEVCLOUD_DRIVER = "docker"
    yield portal_id
    remove_portal_objects(portal_id)


@pytest.fixture
def e2e_dev_root(tmp_path):
    """Stand-in device nodes of the 8-GPU fixture host (dev/kfd and renderD128..184)."""
    if not is_root():
        pytest.skip("creating device nodes (mknod) needs root")
    return stand_in_dev_root(tmp_path / "host-dev")


@pytest.fixture
def e2e_images(db, cpu_image):
    """The catalogue loaded as `manage.py sync_images` does; the cpu image's reference is the built tag."""
    catalog_sync()
    image = Image.objects.get(key="cpu")
    assert image.reference == cpu_image
    return image


class Cloud:
    """The broker and queue of one test, and a way to start (and restart) its workers."""

    def __init__(self, portal_id: str, broker_url: str):
        self.portal_id = portal_id
        self.broker_url = broker_url
        self.queue = unique_queue("e2e")

    @contextmanager
    def worker(self, *, quick_redelivery: bool = False, **env):
        """A real worker on this test's queue, with this test's portal id; stopped when the block ends.

        With `quick_redelivery`, its broker visibility timeout is a few seconds (tests/e2e/worker_settings.py),
        so it takes over the unacknowledged message of a worker that was killed.
        """
        with celery_worker(
            queues=[self.queue],
            broker_url=self.broker_url,
            extra_env=worker_env(self.portal_id, **env),
            settings_module="tests.e2e.worker_settings" if quick_redelivery else "portal.settings.test",
        ) as worker:
            yield worker

    def forget_unacked(self) -> None:
        """Drop this queue's messages that killed workers left unacknowledged, so no later worker on the
        same Redis database restores them into a queue nobody reads."""
        if not self.broker_url.startswith("redis://"):
            return
        client = redis.Redis.from_url(self.broker_url, socket_connect_timeout=2)
        try:
            for tag, payload in client.hgetall("unacked").items():
                if json.loads(payload)[2] == self.queue:
                    client.hdel("unacked", tag)
                    client.zrem("unacked_index", tag)
        except (redis.RedisError, ValueError, IndexError):
            pass
        finally:
            client.close()


@contextmanager
def publishing(broker_url: str, queue: str):
    """Make this process (the web side) publish to `broker_url`/`queue` instead of running tasks inline."""
    try:
        with (
            override_settings(CELERY_TASK_ALWAYS_EAGER=False),
            celery_publishing_to(broker_url=broker_url, queue=queue),
        ):
            yield
    finally:
        # celery_publishing_to leaves the closed pools in kombu's registry; later publishes need fresh ones.
        kombu.pools.reset()


@pytest.fixture
def e2e_cloud(e2e_portal):
    """A Cloud on the shared test Redis (db E2E_REDIS_DB), with this process publishing to its queue."""
    cloud = Cloud(e2e_portal, redis_url(E2E_REDIS_DB))
    with publishing(cloud.broker_url, cloud.queue):
        yield cloud
    cloud.forget_unacked()


@pytest.fixture(scope="session")
def e2e_gateway(django_db_setup):
    """uvicorn serving portal.asgi (the portal and its gateway) against the test database."""
    server = ServerThread()
    server.start()
    yield server
    server.stop()
