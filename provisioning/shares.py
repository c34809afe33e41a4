"""What each GPU of a host gets of the host's CPUs, memory and /dev/shm (docs/architecture.md, "Right-sized
instances").

Discovery reads the host's CPUs, memory and disk (host_resources) and gives each present GPU an even share
of what is left after the host's reserve (even_shares): a 1x instance on an 8-GPU host gets an eighth,
an 8x gets all of it. /dev/shm is SHM_FRACTION of the memory share: it is tmpfs, so what a process puts
there counts against the same memory limit. An operator's override of a share wins (GpuHost.*_override),
and is refused when the host does not have that much (overrides_check).
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import requests
from django.conf import settings

from .engine import is_local_engine

MIB = 1024 * 1024
# /dev/shm is this fraction of the memory share: PyTorch data loaders and vLLM pass tensors through it,
# and half leaves the other half for the processes themselves.
SHM_FRACTION = 0.5
# The reserve never takes more than this fraction of a host (a small development machine still runs
# instances).
MAX_RESERVE_FRACTION = 0.5
MIN_CPUS_PER_GPU = 0.25


class SharesError(Exception):
    """An operator's share does not fit the host; the message says by how much."""


@dataclass(frozen=True)
class HostResources:
    """What a host has: CPUs, memory in MiB, and the size of the filesystem its containers live on in GiB.
    None where it could not be read."""

    cpus: int | None
    memory_mb: int | None
    disk_gb: int | None = None


@dataclass(frozen=True)
class Shares:
    """Per-GPU shares: fractional CPUs, memory and /dev/shm in MiB."""

    cpus_per_gpu: float
    memory_mb_per_gpu: int
    shm_mb_per_gpu: int


def reserved_cpus() -> int:
    return getattr(settings, "DEVCLOUD_HOST_RESERVED_CPUS", 4)


def reserved_memory_mb(memory_mb: int) -> int:
    """The memory held back for the host itself: a percentage of it, at least a floor."""
    percent = getattr(settings, "DEVCLOUD_HOST_RESERVED_MEMORY_PERCENT", 5)
    floor_mb = getattr(settings, "DEVCLOUD_HOST_RESERVED_MEMORY_MIN_MB", 8192)
    return max(floor_mb, memory_mb * percent // 100)


def even_shares(resources: HostResources, gpu_count: int) -> Shares | None:
    """Each of `gpu_count` GPUs' even share of what the host has after its reserve (at most half the
    host is reserved). None when the CPUs or memory are unknown or the host has no GPU."""
    if gpu_count <= 0 or not resources.cpus or not resources.memory_mb:
        return None
    cpus = resources.cpus - min(reserved_cpus(), resources.cpus * MAX_RESERVE_FRACTION)
    memory_mb = resources.memory_mb - min(
        reserved_memory_mb(resources.memory_mb), int(resources.memory_mb * MAX_RESERVE_FRACTION)
    )
    # Docker takes CPUs in hundredths (nano_cpus); round down so eight shares never exceed the host.
    cpus_per_gpu = int(cpus * 100 / gpu_count) / 100
    # On a small machine (a simulated 8-GPU host on a laptop) the reserve leaves slivers: a quarter CPU
    # still starts JupyterLab, and never more than the host has per GPU.
    cpus_per_gpu = max(cpus_per_gpu, min(MIN_CPUS_PER_GPU, int(resources.cpus * 100 / gpu_count) / 100))
    memory_mb_per_gpu = memory_mb // gpu_count
    return Shares(
        cpus_per_gpu=max(cpus_per_gpu, 0.01),
        memory_mb_per_gpu=memory_mb_per_gpu,
        shm_mb_per_gpu=int(memory_mb_per_gpu * SHM_FRACTION),
    )


def effective_shares(host, computed: Shares | None) -> dict:
    """The values of cpus_per_gpu, memory_mb_per_gpu and shm_mb_per_gpu `host` should have: each override,
    else the computed share, else what it has now."""
    fallback = Shares(host.cpus_per_gpu, host.memory_mb_per_gpu, host.shm_mb_per_gpu)
    base = computed or fallback
    return {
        "cpus_per_gpu": _first(host.cpus_per_gpu_override, base.cpus_per_gpu),
        "memory_mb_per_gpu": _first(host.memory_mb_per_gpu_override, base.memory_mb_per_gpu),
        "shm_mb_per_gpu": _first(host.shm_mb_per_gpu_override, base.shm_mb_per_gpu),
    }


def _first(override, value):
    return override if override is not None else value


def overrides_check(
    *, host_cpus, host_memory_mb, gpu_count: int, cpus=None, memory_mb=None, shm_mb=None, memory_share_mb=None
) -> dict[str, str]:
    """Errors, by override name ("cpus", "memory_mb", "shm_mb"), for per-GPU overrides the host cannot give
    to all of its `gpu_count` GPUs at once, or a /dev/shm larger than the memory share (`memory_mb`, else
    `memory_share_mb`). {} when they fit (or the host's size is not known yet, and then only the shm rule
    applies)."""
    errors = {}
    gpus = max(gpu_count, 1)
    if cpus is not None and host_cpus and cpus * gpus > host_cpus:
        errors["cpus"] = (
            f"{cpus:g} CPUs per GPU is {cpus * gpus:g} CPUs for its {gpus} GPU(s), but it has "
            f"{host_cpus}. At most {host_cpus / gpus:.2f}."
        )
    if memory_mb is not None and host_memory_mb and memory_mb * gpus > host_memory_mb:
        errors["memory_mb"] = (
            f"{memory_mb} MB per GPU is {memory_mb * gpus} MB for its {gpus} GPU(s), but it has "
            f"{host_memory_mb} MB. At most {host_memory_mb // gpus}."
        )
    memory_share_mb = memory_mb if memory_mb is not None else memory_share_mb
    if shm_mb is not None and memory_share_mb is not None and shm_mb > memory_share_mb:
        errors["shm_mb"] = (
            f"/dev/shm of {shm_mb} MB per GPU is more than the {memory_share_mb} MB memory share it counts "
            "against."
        )
    return errors


# --- Reading what a host has ------------------------------------------------------------------------


def host_resources(host) -> HostResources:
    """The host's CPUs, memory and disk: read here for this machine's engine, from the engine's /info
    otherwise. Never raises: what cannot be read is None, and discovery then keeps the shares it had."""
    if is_local_engine(host.docker_url):
        return _resources_here(Path(host.sysfs_root or "/"))
    return _resources_through_engine(host)


def _resources_here(root: Path) -> HostResources:
    # A stand-in sysfs root (tests, a copied topology) may carry the host's proc/meminfo and its online
    # CPU list; without them this machine's own are read, since a local engine runs on this machine.
    meminfo = root / "proc" / "meminfo"
    online = root / "sys" / "devices" / "system" / "cpu" / "online"
    memory_mb = _meminfo_total_mb(meminfo if meminfo.is_file() else Path("/proc/meminfo"))
    cpus = _online_cpus(online) if online.is_file() else os.cpu_count()
    disk_root = root / "var" / "lib" / "docker"
    disk_gb = _disk_gb(disk_root if disk_root.is_dir() else root)
    return HostResources(cpus=cpus, memory_mb=memory_mb, disk_gb=disk_gb)


def _resources_through_engine(host) -> HostResources:
    from .hostfs import HostFilesError, _client

    # The engine does not say how big its data root's filesystem is: disk stays unknown for such hosts.
    try:
        with _client(host) as client:
            info = client.info()
    except (HostFilesError, docker.errors.DockerException, requests.RequestException, OSError):
        return HostResources(cpus=None, memory_mb=None)
    memory = info.get("MemTotal")
    return HostResources(cpus=info.get("NCPU") or None, memory_mb=memory // MIB if memory else None)


def _meminfo_total_mb(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _online_cpus(path: Path) -> int | None:
    """CPUs in a kernel CPU list such as "0-95,128-223"."""
    try:
        count = 0
        for part in path.read_text().strip().split(","):
            first, _, last = part.partition("-")
            count += int(last or first) - int(first) + 1
        return count or None
    except (OSError, ValueError):
        return None


def _disk_gb(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).total // 1024**3
    except OSError:
        return None


# --- What a size gets, for the launch page and the API ----------------------------------------------


@dataclass(frozen=True)
class SizeResources:
    """What an instance of `gpus` GPUs gets on the hosts in service that can take it: the smallest among
    them (`varies` when another host gives more). GiB; gpu_memory_gb None where no host says (Slurm)."""

    gpus: int
    cpus: float
    memory_gb: float
    shm_gb: float
    gpu_memory_gb: float | None
    varies: bool

    @property
    def text(self) -> str:
        """E.g. "23.5 CPUs, 243.2 GiB RAM, 121.6 GiB /dev/shm, 192 GiB GPU memory", prefixed "At least"
        when hosts differ."""
        parts = [f"{self.cpus:g} CPUs", f"{self.memory_gb:g} GiB RAM", f"{self.shm_gb:g} GiB /dev/shm"]
        if self.gpu_memory_gb is not None:
            parts.append(f"{self.gpu_memory_gb:g} GiB GPU memory")
        prefix = "At least " if self.varies else ""
        return prefix + ", ".join(parts) + (" (more on some hosts)" if self.varies else "")


def size_resources(gpu_counts) -> dict[int, SizeResources]:
    """For each GPU count in `gpu_counts`, what an instance of it gets (SizeResources), from the hosts in
    service that have that many GPUs present (Slurm partitions count for every size). A count no host
    can take is left out. One query; no engine is asked."""
    from django.db.models import Count, Min, Q

    from .models import GpuHost

    hosts = list(
        GpuHost.objects.filter(state=GpuHost.State.ACTIVE)
        .annotate(
            present=Count("gpus", filter=Q(gpus__is_present=True)),
            smallest_vram=Min("gpus__vram_bytes", filter=Q(gpus__is_present=True)),
        )
        .only("backend", "cpus_per_gpu", "memory_mb_per_gpu", "shm_mb_per_gpu")
    )
    result = {}
    for gpus in gpu_counts:
        offers = []
        for host in hosts:
            if host.backend != GpuHost.Backend.SLURM and host.present < gpus:
                continue
            memory_mb = host.memory_mb_per_gpu * gpus
            shm_mb = host.shm_mb_per_gpu * gpus if host.shm_mb_per_gpu else min(memory_mb // 2, 64 * 1024)
            vram = host.smallest_vram * gpus / 1024**3 if host.smallest_vram else None
            cpus = round(host.cpus_per_gpu * gpus, 2)
            offers.append((cpus, memory_mb / 1024, min(shm_mb, memory_mb) / 1024, vram))
        if not offers:
            continue
        smallest = tuple(
            min((offer[index] for offer in offers if offer[index] is not None), default=None)
            for index in range(4)
        )
        result[gpus] = SizeResources(
            gpus=gpus,
            cpus=smallest[0],
            memory_gb=round(smallest[1], 1),
            shm_gb=round(smallest[2], 1),
            gpu_memory_gb=round(smallest[3]) if smallest[3] is not None else None,
            varies=len(set(offers)) > 1,
        )
    return result
