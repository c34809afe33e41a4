"""The operator's view of a host's images: what it has, and "pre-pull or build" so launches never wait."""

import shutil
import uuid

import pytest

from portal.instances.catalog import CONTAINERS_DIR, load_catalog
from provisioning.drivers.base import DriverError
from provisioning.drivers.docker_engine import DockerEngine
from tests.support.docker_instances import docker_client
from tests.support.images import cpu_image_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

REAL_BASE = load_catalog().base


@pytest.fixture
def host(db):
    from provisioning.models import GpuHost

    return GpuHost.objects.create(name="gpu-images-01")


def catalogue_copy(tmp_path, *, suite=REAL_BASE.suite, marker=""):
    """A catalogue of one image built from a copy of containers/cpu (plus a marker file, which changes the
    hash but no layer, so the build reuses the real image's cache). Returns its path."""
    containers = tmp_path / "containers"
    shutil.copytree(CONTAINERS_DIR / "cpu", containers / "cpu")
    (containers / "cpu" / "MARKER").write_text(marker or uuid.uuid4().hex)
    (containers / "catalog.toml").write_text(
        f"""
[base]
repository = "{REAL_BASE.repository}"
suite = "{suite}"
variant = "{REAL_BASE.variant}"
arch = "{REAL_BASE.arch}"

[images.rebuild]
name = "Rebuild"
sizes = ["1x"]
context = "cpu"
base = "debian"
repository = "devcloud/test-drv-rebuild"
"""
    )
    return containers / "catalog.toml"


def test_it_lists_the_images_on_the_host(host, cpu_image):
    assert cpu_image in DockerEngine(host).images()


def test_it_reports_an_image_already_on_the_host_without_building(host, cpu_image):
    lines = []

    outcome = DockerEngine(host).ensure_image(cpu_image, "cpu", progress=lines.append)

    assert outcome == "present"
    assert lines == [f"{cpu_image} is already on {host.name}"]


def test_it_builds_a_missing_image_from_its_catalogue_context(host, tmp_path, cpu_image):
    catalog_path = catalogue_copy(tmp_path)
    reference = load_catalog(catalog_path).reference("rebuild")
    lines = []
    engine = DockerEngine(host)
    try:
        outcome = engine.ensure_image(reference, "cpu", progress=lines.append, catalog_path=catalog_path)
        present = reference in engine.images()
    finally:
        if reference in DockerEngine(host).images():
            docker_client().images.remove(reference)

    assert outcome == "built"
    assert present
    assert any(line.startswith("Step ") for line in lines), lines
    assert lines[-1] == f"built {reference}"


def test_it_refuses_to_build_a_tag_the_catalogue_no_longer_produces(host, tmp_path, cpu_image):
    catalog_path = catalogue_copy(tmp_path)
    stale = "devcloud/test-drv-rebuild:000000000000"

    with pytest.raises(DriverError) as failure:
        DockerEngine(host).ensure_image(stale, "cpu", catalog_path=catalog_path)

    assert failure.value.permanent is True
    assert "sync_images" in failure.value.message
    assert stale not in DockerEngine(host).images()


def test_it_says_how_to_make_a_missing_local_base(host, tmp_path, cpu_image):
    catalog_path = catalogue_copy(tmp_path, suite="trixie")
    reference = load_catalog(catalog_path).reference("rebuild")

    with pytest.raises(DriverError) as failure:
        DockerEngine(host).ensure_image(reference, "cpu", catalog_path=catalog_path)

    assert failure.value.permanent is True
    assert "scripts/build-images.sh" in failure.value.message


def test_it_fails_for_now_when_the_registry_cannot_be_reached(host):
    # A registry on a closed loopback port: the engine tries it and is refused, no traffic leaves.
    with pytest.raises(DriverError) as failure:
        DockerEngine(host).ensure_image("127.0.0.1:1/devcloud/absent:1", "")

    assert failure.value.permanent is False
