"""A third host joins the fleet: registered over mutual TLS on its private address, it gets the enabled
catalogue images by pull from the fleet's registry (IMAGE_REGISTRY), with the pull's progress on its image
jobs, and then discovers its GPUs with the helper that came with them."""

import uuid

import pytest

from portal.instances.catalog import catalog_sync
from portal.instances.models import Image
from provisioning import images
from provisioning import services as hosts_services
from provisioning.models import HostImage, ImageJob

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600, func_only=True)]


@pytest.fixture
def new_host(fleet):
    added = fleet.add_host()
    yield added
    fleet.remove_host(added)


def test_a_new_host_gets_the_enabled_catalogue_images_by_pull_from_the_registry_with_progress(
    fleet, fleet_cpu_image, new_host, db, settings, olivia, monkeypatch, django_capture_on_commit_callbacks
):
    settings.DEVCLOUD_DRIVER = "docker"
    settings.DEVCLOUD_PORTAL_ID = f"test-new-{uuid.uuid4().hex[:8]}"
    settings.IMAGE_REGISTRY = fleet.registry.address
    catalog_sync()
    cpu = Image.objects.get(key="cpu")
    # Only the CPU image is built on this machine (and pushed by the fleet_cpu_image fixture); the ROCm
    # images are many gigabytes, so the catalogue the new host gets is the CPU image alone.
    Image.objects.exclude(key="cpu").update(is_enabled=False, is_default=False)
    reported = []
    run_writer = images._ProgressWriter.__call__

    def watch(writer, text):
        run_writer(writer, text)
        reported.append((str(text), writer.percent))

    monkeypatch.setattr(images._ProgressWriter, "__call__", watch)

    host = hosts_services.host_register(
        name=new_host.name,
        docker_url=new_host.docker_url,
        private_address=new_host.private_address,
        tls_ca_cert=new_host.tls_ca_cert,
        tls_client_cert=new_host.tls_client_cert,
        tls_client_key=new_host.tls_client_key,
        sysfs_root=new_host.sysfs_root,
        dev_root=new_host.dev_root,
        discover=False,
    )
    with django_capture_on_commit_callbacks(execute=True):
        jobs = images.host_images_prefetch(host=host, actor=olivia)
    summary = hosts_services.host_discover(host_id=host.pk)

    assert cpu.reference == fleet.registry.reference(fleet_cpu_image)
    assert [job.image.key for job in jobs] == ["cpu"]
    job = ImageJob.objects.get(pk=jobs[0].pk)
    assert (job.state, job.outcome, job.percent) == (ImageJob.State.DONE, "pulled", 100)
    assert reported[0][0] == f"pulling {cpu.reference} on {host.name}"
    assert job.progress_text.endswith(f"{cpu.reference}: pulled")
    # The pull's percent moved while it ran, and only forwards.
    percents = [percent for text, percent in reported if text.startswith("Pull ")]
    assert percents == sorted(percents) and any(0 < percent < 100 for percent in percents)
    pulled = new_host.client().images.get(cpu.reference)
    assert any(digest.startswith(f"{fleet.registry.address}/") for digest in pulled.attrs["RepoDigests"])
    assert HostImage.objects.get(host=host, reference=cpu.reference).present
    assert summary.present == 8
    # Its size came from its engine's /info (NCPU, MemTotal), and each GPU got an even share of it.
    host.refresh_from_db()
    info = new_host.client().info()
    assert (host.host_cpus, host.host_memory_mb) == (info["NCPU"], info["MemTotal"] // (1024 * 1024))
    assert 0 < host.cpus_per_gpu * 8 <= host.host_cpus
    assert 0 < host.memory_mb_per_gpu * 8 < host.host_memory_mb
