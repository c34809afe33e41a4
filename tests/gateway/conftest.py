"""A real gateway (uvicorn serving portal.asgi in a thread) in front of a real JupyterLab subprocess.

The server runs in this process so it reads the test database pytest-django created; tests that use
it are marked django_db(transaction=True) so the rows they make are committed and visible to the
gateway's threads.
"""

import secrets
import subprocess

import pytest

from portal.instances.models import Image

from .helpers import LAB_INSTANCE_ID, ServerThread, make_instance, start_jupyterlab


@pytest.fixture(scope="session")
def jupyterlab(tmp_path_factory):
    """A running JupyterLab for LAB_INSTANCE_ID: (endpoint, token)."""
    token = secrets.token_hex(24)
    root = tmp_path_factory.mktemp("lab-root")
    home = tmp_path_factory.mktemp("lab-home")
    process, endpoint = start_jupyterlab(instance_id=LAB_INSTANCE_ID, token=token, root_dir=root, home=home)
    yield endpoint, token
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def portal_server(django_db_setup):
    server = ServerThread()
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh_decision_cache():
    # Each test starts with no remembered decisions, so one test's "allowed" never answers another's.
    from portal.gateway.access import decision_cache

    decision_cache.clear()
    yield
    decision_cache.clear()


@pytest.fixture
def image(db):
    return Image.objects.create(
        key="cpu", name="CPU JupyterLab", sizes=["1x"], reference="devcloud/cpu:test", needs_gpu=False
    )


@pytest.fixture
def alice_lab(alice, image, jupyterlab):
    """Alice's running instance, served by the session's JupyterLab."""
    endpoint, token = jupyterlab
    return make_instance(alice, image, endpoint=endpoint, token=token, instance_id=LAB_INSTANCE_ID)
