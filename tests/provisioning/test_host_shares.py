"""Right-sized instances: discovery gives each GPU an even share of its host's CPUs, memory and /dev/shm,
after the host's reserve; an operator's override wins, and one the host cannot give is refused; the start
spec, the launch page and the API carry the figures.

The host is the 8x MI300X KFD fixture with a stand-in proc/meminfo (2 TiB) and CPU list (192 CPUs).
Run with -s to see what a 1x and an 8x instance get on it.
"""

import shutil

import pytest
from django.urls import reverse
from pytest_django.asserts import assertContains

from portal.instances.models import Image, Instance
from portal.instances.start_spec import start_spec_for
from provisioning import services
from provisioning.drivers.slurm import SlurmDriver
from provisioning.models import GpuHost, SlurmCluster
from provisioning.shares import HostResources, even_shares
from tests.api.conftest import token_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cloud")]

LOCAL_ENGINE = "unix:///var/run/docker.sock"
GIB = 1024**3
MIB = 1024**2
HOST_MEMORY_MB = 2 * 1024 * 1024  # 2 TiB
# The documented reserve (portal/settings/base.py): 4 CPUs and 5% of the memory (at least 8 GiB).
SHARED_CPUS = 192 - 4
SHARED_MEMORY_MB = HOST_MEMORY_MB - HOST_MEMORY_MB * 5 // 100


@pytest.fixture
def big_host_sysfs(tmp_path, kfd_sysfs_8gpu):
    """The MI300X topology plus what a 192-CPU, 2 TiB host's /proc/meminfo and CPU list say."""
    root = tmp_path / "mi300x-big"
    shutil.copytree(kfd_sysfs_8gpu, root)
    (root / "proc").mkdir()
    (root / "proc" / "meminfo").write_text(
        f"MemTotal:       {HOST_MEMORY_MB * 1024} kB\nMemFree:        {HOST_MEMORY_MB * 1000} kB\n"
    )
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text("0-95,96-191\n")
    return root


@pytest.fixture
def big_host(big_host_sysfs):
    return services.host_register(name="mi300x-01", docker_url=LOCAL_ENGINE, sysfs_root=str(big_host_sysfs))


@pytest.fixture
def cpu_image(db):
    return Image.objects.create(
        key="cpu-shares", name="CPU", reference="devcloud/cpu:shares", sizes=["1x", "8x"]
    )


def spec_for(host, alice, image, size):
    instance = Instance.objects.create(user=alice, size=size, image=image, host=host, jupyter_token="t" * 48)
    gpus = list(host.gpus.order_by("node_id"))[: 1 if size == "1x" else 8]
    return start_spec_for(instance, host=host, gpus=gpus)


def describe(spec) -> str:
    return (
        f"{spec.gpu_count} GPU(s): {spec.cpus:g} CPUs, {spec.memory_bytes / GIB:.1f} GiB RAM, "
        f"{spec.shm_bytes / GIB:.1f} GiB /dev/shm"
    )


def test_discovery_reads_the_hosts_cpus_and_memory_and_gives_each_gpu_an_even_share(big_host):
    assert (big_host.host_cpus, big_host.host_memory_mb) == (192, HOST_MEMORY_MB)
    assert big_host.cpus_per_gpu == SHARED_CPUS / 8 == 23.5
    assert big_host.memory_mb_per_gpu == SHARED_MEMORY_MB // 8
    assert big_host.shm_mb_per_gpu == SHARED_MEMORY_MB // 8 // 2


def test_a_1x_gets_an_eighth_and_an_8x_everything_but_the_reserve(big_host, alice, cpu_image):
    one = spec_for(big_host, alice, cpu_image, "1x")
    eight = spec_for(big_host, alice, cpu_image, "8x")
    print(f"\nOn a 192-CPU, 2 TiB MI300X host: 1x -> {describe(one)}; 8x -> {describe(eight)}")

    assert (one.cpus, one.memory_bytes) == (23.5, SHARED_MEMORY_MB // 8 * MIB)
    assert one.shm_bytes == one.memory_bytes // 2
    assert eight.cpus == SHARED_CPUS
    assert abs(eight.memory_bytes - SHARED_MEMORY_MB * MIB) < 8 * MIB
    assert eight.shm_bytes == eight.memory_bytes // 2
    # The reserve is left to the host.
    assert eight.cpus <= 192 - 4 and eight.memory_bytes <= (HOST_MEMORY_MB - 100 * 1024) * MIB


def test_a_small_machine_keeps_at_least_half_for_itself_and_a_quarter_cpu_per_gpu():
    shares = even_shares(HostResources(cpus=2, memory_mb=8192), 8)

    assert shares.cpus_per_gpu == 0.25
    assert shares.memory_mb_per_gpu == 4096 // 8


def test_a_host_whose_size_cannot_be_read_keeps_the_shares_it_had(kfd_sysfs_8gpu):
    # As a host from before migration 0008 whose engine does not answer /info.
    host = GpuHost.objects.create(name="old-host", docker_url=LOCAL_ENGINE, sysfs_root=str(kfd_sysfs_8gpu))

    unknown = HostResources(cpus=None, memory_mb=None)
    services._host_shares_write(host_id=host.pk, resources=unknown, gpu_count=8)

    host.refresh_from_db()
    assert (host.cpus_per_gpu, host.memory_mb_per_gpu, host.shm_mb_per_gpu) == (1.0, 4096, None)
    assert (host.host_cpus, host.host_memory_mb) == (None, None)


# --- The operator's overrides (admin host form) -------------------------------------------------------


def change_form(host, **overrides):
    form = {
        "name": host.name,
        "docker_url": host.docker_url,
        "tls_ca_cert": "",
        "tls_client_cert": "",
        "tls_client_key": "",
        "sysfs_root": host.sysfs_root,
        "dev_root": host.dev_root,
        "cpus_per_gpu_override": "",
        "memory_mb_per_gpu_override": "",
        "shm_mb_per_gpu_override": "",
        "gpus-TOTAL_FORMS": 0,
        "gpus-INITIAL_FORMS": 0,
        "gpus-MIN_NUM_FORMS": 0,
        "gpus-MAX_NUM_FORMS": 1000,
    }
    form.update(overrides)
    return form


def change_url(host):
    return reverse("admin:provisioning_gpuhost_change", args=[host.pk])


def test_an_operators_override_wins_and_survives_the_next_discovery(
    olivia_client, big_host, alice, cpu_image
):
    form = change_form(big_host, cpus_per_gpu_override="16", shm_mb_per_gpu_override="65536")
    response = olivia_client.post(change_url(big_host), form)
    assert response.status_code == 302, response.content.decode()[:2000]

    services.host_discover(host_id=big_host.pk)
    big_host.refresh_from_db()
    assert (big_host.cpus_per_gpu, big_host.shm_mb_per_gpu) == (16, 65536)
    assert big_host.memory_mb_per_gpu == SHARED_MEMORY_MB // 8
    spec = spec_for(big_host, alice, cpu_image, "1x")
    assert (spec.cpus, spec.shm_bytes) == (16, 64 * GIB)


def test_clearing_an_override_brings_back_the_even_share(olivia_client, big_host):
    olivia_client.post(change_url(big_host), change_form(big_host, cpus_per_gpu_override="16"))
    olivia_client.post(change_url(big_host), change_form(big_host))

    big_host.refresh_from_db()
    assert big_host.cpus_per_gpu == 23.5


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("cpus_per_gpu_override", "30", "240 CPUs for its 8 GPU(s), but it has 192"),
        ("memory_mb_per_gpu_override", "300000", "but it has 2097152 MB"),
        ("shm_mb_per_gpu_override", "300000", "more than the 249036 MB memory share"),
        ("cpus_per_gpu_override", "0", "a share must be more than 0"),
    ],
)
def test_an_override_the_host_cannot_give_is_refused_saying_why(
    olivia_client, big_host, field, value, says
):
    response = olivia_client.post(change_url(big_host), change_form(big_host, **{field: value}))

    assert response.status_code == 200
    assertContains(response, says)
    big_host.refresh_from_db()
    assert getattr(big_host, field) is None
    assert big_host.cpus_per_gpu == 23.5


def test_the_host_page_shows_what_the_host_has_and_what_each_gpu_gets(olivia_client, big_host):
    page = olivia_client.get(change_url(big_host))

    assertContains(page, "192 CPUs, 2048 GiB memory")
    assertContains(page, "23.5 CPUs, 243.2 GiB memory, /dev/shm 121.6 GiB")


# --- What a size gets, on the launch page and in the API ----------------------------------------------


def test_the_launch_page_shows_what_each_size_gets(settings, alice_client, big_host):
    settings.LAUNCH_CATALOGUE_CACHE_SECONDS = 0
    page = alice_client.get("/instances/")

    assertContains(page, "23.5 CPUs, 243.2 GiB RAM, 121.6 GiB /dev/shm, 192 GiB GPU memory")
    assertContains(page, "188 CPUs, 1945.6 GiB RAM, 972.8 GiB /dev/shm, 1536 GiB GPU memory")


def test_the_launch_page_shows_the_smallest_share_when_hosts_differ(
    settings, alice_client, big_host, kfd_sysfs_8gpu
):
    settings.LAUNCH_CATALOGUE_CACHE_SECONDS = 0
    small = services.host_register(
        name="mi300x-02", docker_url=LOCAL_ENGINE, sysfs_root=str(kfd_sysfs_8gpu), discover=True
    )
    GpuHost.objects.filter(pk=small.pk).update(cpus_per_gpu=8, memory_mb_per_gpu=65536, shm_mb_per_gpu=32768)

    page = alice_client.get("/instances/")

    assertContains(
        page, "At least 8 CPUs, 64 GiB RAM, 32 GiB /dev/shm, 192 GiB GPU memory (more on some hosts)"
    )


def test_the_launch_page_says_when_no_host_can_take_a_size(settings, alice_client):
    settings.LAUNCH_CATALOGUE_CACHE_SECONDS = 0
    page = alice_client.get("/instances/")

    assertContains(page, "CPUs and RAM depend on the host that takes it: none in service has 8 GPUs now.")


def test_the_api_gives_each_sizes_cpus_ram_shm_and_gpu_memory(settings, alice, big_host):
    settings.LAUNCH_CATALOGUE_CACHE_SECONDS = 0
    _, api = token_for(alice)

    sizes = {row["key"]: row["resources"] for row in api.get("/api/v1/sizes").json()}

    assert sizes["1x"] | {"text": ""} == {
        "cpus": 23.5,
        "memory_gb": 243.2,
        "shm_gb": 121.6,
        "gpu_memory_gb": 192,
        "varies": False,
        "text": "",
    }
    eight = sizes["8x"]
    assert (eight["cpus"], eight["memory_gb"], eight["gpu_memory_gb"]) == (188, 1945.6, 1536)


def test_a_slurm_job_asks_for_the_partitions_shares(alice, cpu_image):
    cluster = SlurmCluster.objects.create(
        name="hpc",
        rest_url="http://127.0.0.1:1",
        rest_user="devcloud",
        token_sealed="",
        image_root="/srv/img",
        workspace_root="/srv/ws",
        job_root="/srv/jobs",
        callback_url="http://127.0.0.1:8000",
    )
    partition = GpuHost.objects.create(
        name="hpc/gpu",
        backend="slurm",
        slurm_cluster=cluster,
        slurm_partition="gpu",
        cpus_per_gpu=23.5,
        memory_mb_per_gpu=249036,
        shm_mb_per_gpu=124518,
    )
    instance = Instance.objects.create(user=alice, size="8x", image=cpu_image, jupyter_token="t" * 48)

    job = SlurmDriver(partition)._job_request(start_spec_for(instance, host=partition))

    assert (job["cpus_per_task"], job["memory_per_node"]) == (188, 8 * 249036)
    assert job["environment"]["DEVCLOUD_SHM_MB"] == str(8 * 124518)
