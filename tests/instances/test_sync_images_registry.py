"""With IMAGE_REGISTRY set, `manage.py sync_images` names every catalogue image by its registry, so a host
that lacks one pulls it from there; without it the references stay bare, as `make run` builds them."""

import io

from django.core.management import call_command

from portal.instances.catalog import image_reference, registry_qualified
from portal.instances.models import Image
from provisioning.drivers.docker_engine import on_a_registry


def sync() -> str:
    out = io.StringIO()
    call_command("sync_images", stdout=out)
    return out.getvalue()


def test_it_names_every_image_by_the_configured_registry_so_hosts_pull_it(db, settings):
    settings.IMAGE_REGISTRY = "registry.internal:5000"

    sync()

    for image in Image.objects.all():
        assert image.reference == f"registry.internal:5000/{image_reference(image.key)}"
        assert on_a_registry(image.reference)


def test_it_keeps_bare_references_that_only_a_build_makes_without_a_registry(db, settings):
    settings.IMAGE_REGISTRY = ""

    sync()

    cpu = Image.objects.get(key="cpu")
    assert cpu.reference == image_reference("cpu")
    assert not on_a_registry(cpu.reference)


def test_switching_the_registry_on_later_updates_the_references(db, settings):
    sync()
    settings.IMAGE_REGISTRY = "registry.internal:5000"

    output = sync()

    assert Image.objects.get(key="cpu").reference.startswith("registry.internal:5000/devcloud/cpu:")
    assert "updated cpu: reference" in output


def test_a_repository_that_names_its_own_registry_keeps_it():
    assert registry_qualified("ghcr.io/amd/rocm", "registry.internal:5000") == "ghcr.io/amd/rocm"
    qualified = registry_qualified("devcloud/cpu", "registry.internal:5000/")
    assert qualified == "registry.internal:5000/devcloud/cpu"
    assert registry_qualified("devcloud/cpu", "") == "devcloud/cpu"
