"""What the lifecycle hands a driver: the start spec and the instance reference (provisioning/drivers/base.py).

The driver reads no rows of the apps; everything it needs about an instance is gathered here, once, from
the instance, its image, its size, its place's per-GPU shares, the owner's SSH keys and the launch policy.
"""

from django.conf import settings

from portal.gateway import lab_path
from portal.sshgateway.services import authorized_keys_text
from provisioning.drivers.base import GpuDevice, InstanceRef, StartSpec
from provisioning.identity import install_id
from provisioning.workspaces import workspace_name

from .models import Instance, LaunchPolicy
from .sizes import SIZES, disk_limit_bytes, workspace_limit_bytes

GIB = 1024**3
MIB = 1024**2
# A host without a /dev/shm share (GpuHost.shm_mb_per_gpu, set by discovery: provisioning/shares.py) gives
# half the memory limit (PyTorch data loaders live there), but no more than this.
MAX_SHM_BYTES = 64 * GIB
# An instance without a session limit still gets a backend time limit: Slurm wants one, and a job that
# outlives every sensible session is one DevCloud lost track of.
UNLIMITED_SESSION_SECONDS = 7 * 24 * 3600


def pids_per_gpu() -> int:
    # Processes and threads an instance may have, per GPU: stops a fork bomb from taking the host down.
    return getattr(settings, "DEVCLOUD_PIDS_PER_GPU", 4096)


def shm_bytes_for(host, shares: int, memory_bytes: int) -> int:
    """/dev/shm of an instance holding `shares` GPUs of `host` with `memory_bytes` of memory."""
    if host.shm_mb_per_gpu:
        return min(int(host.shm_mb_per_gpu) * shares * MIB, memory_bytes)
    return min(memory_bytes // 2, MAX_SHM_BYTES)


def start_spec_for(instance: Instance, *, host, gpus=()) -> StartSpec:
    """The StartSpec for `instance` on `host`: `gpus` are the Gpu rows the scheduler allocated there
    (empty where the backend places, and then the size says how many)."""
    gpu_count = len(gpus) or SIZES[instance.size].gpus
    shares = max(1, gpu_count)
    memory_bytes = int(host.memory_mb_per_gpu) * shares * MIB
    max_hours = LaunchPolicy.current().max_session_hours_for(instance.size)
    return StartSpec(
        instance_id=instance.id,
        owner_id=instance.user_id,
        image_reference=instance.image.reference,
        image_name=instance.image.name,
        gpus=tuple(GpuDevice(render_minor=gpu.render_minor, render_gid=gpu.render_gid) for gpu in gpus),
        gpu_count=gpu_count,
        cpus=float(host.cpus_per_gpu) * shares,
        memory_bytes=memory_bytes,
        shm_bytes=shm_bytes_for(host, shares, memory_bytes),
        pids_limit=pids_per_gpu() * shares,
        authorized_keys=authorized_keys_text(instance.user_id),
        lab_base_path=lab_path(instance.id),
        jupyter_token=instance.jupyter_token,
        workspace=workspace_name(instance.user_id),
        time_limit_seconds=max_hours * 3600 if max_hours else UNLIMITED_SESSION_SECONDS,
        owner_key=instance.user.workspace_key.hex,
        install_id=install_id(),
        workspace_limit_bytes=workspace_limit_bytes(instance.size),
        disk_limit_bytes=disk_limit_bytes(instance.size),
    )


def instance_ref(instance: Instance) -> InstanceRef:
    """The InstanceRef every driver call after start takes."""
    return InstanceRef(
        id=instance.id,
        owner_id=instance.user_id,
        jupyter_token=instance.jupyter_token,
        state=dict(instance.driver_state or {}),
    )
