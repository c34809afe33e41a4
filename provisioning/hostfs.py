"""What the portal reads of a GPU host's own files, read on that host through its Docker engine.

Three things live only on the GPU host: the KFD topology (`<sysfs_root>/sys/class/kfd`), the group ids
of its device nodes (`<dev_root>/dev/kfd`, `<dev_root>/dev/dri/renderD*`), and each GPU's utilisation
(`<sysfs_root>/sys/class/drm/renderD<minor>/device/gpu_busy_percent`). The portal and its worker run
elsewhere and reach the host only through its engine, so the engine shows them: a short-lived helper
container prints the files and is removed.

The helper is hardened like an instance and more: no network, a read-only root filesystem, every
capability dropped, no-new-privileges, uid 65534 (nobody), a few processes and 64 MiB. It sees the
host's files only through read-only bind mounts:
  - `<dev_root>/dev/kfd` and `<dev_root>/dev/dri`, whose group ids it prints (it opens none of them;
    the container's device cgroup would refuse anyway);
  - `<sysfs_root>/sys` when `sysfs_root` is not "/" (a stand-in tree). On a real host (`sysfs_root` "/")
    nothing is mounted: every container's own /sys is the host's sysfs, read-only, and amdgpu's
    symlinks (sys/class/kfd/kfd -> ../../devices/...) resolve there as they do on the host.

The helper image needs only `sh`, `cat` and `stat`. It is the catalogue's `cpu` image (Debian with
JupyterLab), because every host gets it the way it gets any catalogue image: built or pre-pulled by
an operator ("Pre-pull or build an image" in the console), or pulled from the registry the catalogue
names. `settings.DEVCLOUD_HOST_HELPER_IMAGE` names another one (the Debian base
`devcloud/debian-base:...` is enough). When the image is missing and its reference names a registry,
it is pulled once.

An engine on this machine (a unix:// socket, the only kind services.host_endpoint_check accepts for
this machine) needs no helper: its files are read directly, which is faster and what `make run` uses.
"""

import logging
import os
import posixpath
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker.errors
import requests
from django.conf import settings
from docker.types import Mount

from .drivers.base import DriverError
from .engine import is_local_engine
from .identity import install_id
from .inventory import GpuInfo, InventoryError, LocalTree, SnapshotTree, inventory_from, read_inventory

logger = logging.getLogger(__name__)

# Seconds for one API call to the engine, and for the helper to finish.
API_TIMEOUT_SECONDS = 15
HELPER_TIMEOUT_SECONDS = 30
HELPER_MEMORY_BYTES = 64 * 1024 * 1024
HELPER_PIDS = 16
HELPER_USER = "65534:65534"
# Where the helper sees the host's stand-in sysfs and its device nodes.
HOST_MOUNT = "/host"

# Prints the files asked for, one "@" line before each, and "@end" last (a cut-off answer lacks it).
HELPER_SCRIPT = r"""
mode=$1; root=$2; shift 2
if [ "$mode" = survey ]; then
  nodes="$root/sys/class/kfd/kfd/topology/nodes"
  for f in "$nodes"/*/properties "$nodes"/*/gpu_id "$nodes"/*/mem_banks/*/properties; do
    [ -f "$f" ] || continue
    printf '\n@file %s\n' "${f#"$root"/}"
    cat "$f"
  done
  for d in /host/dev/kfd /host/dev/dri/renderD*; do
    [ -e "$d" ] && printf '\n@gid %s %s\n' "${d#/host/}" "$(stat -c %g "$d")"
  done
elif [ "$mode" = health ]; then
  nodes="$root/sys/class/kfd/kfd/topology/nodes"
  for f in "$nodes"/*/properties "$nodes"/*/gpu_id; do
    [ -f "$f" ] || continue
    printf '\n@file %s\n' "${f#"$root"/}"
    cat "$f"
  done
  [ -d /host/dev/dri ] && printf '\n@dri\n'
  for m in "$@"; do
    [ -e "/host/dev/dri/renderD$m" ] && printf '\n@node %s\n' "$m"
    for f in "$root/sys/class/drm/renderD$m/device/ras/"*_err_count; do
      [ -f "$f" ] || continue
      printf '\n@file %s\n' "${f#"$root"/}"
      cat "$f" 2>/dev/null
    done
  done
else
  for m in "$@"; do
    printf '\n@busy %s %s\n' "$m" "$(cat "$root/sys/class/drm/renderD$m/device/gpu_busy_percent" 2>/dev/null)"
  done
fi
printf '\n@end\n'
"""


class HostFilesError(InventoryError):
    """The host's files could not be read through its engine; the message says why and what to do."""


@dataclass
class GpuSurvey:
    """What discovery reads of a host: its GPUs and the group ids of its device nodes."""

    gpus: list[GpuInfo]
    # gid of dev/kfd, None when the node does not exist.
    kfd_gid: int | None = None
    # render minor -> gid of dev/dri/renderD<minor>, for the nodes that exist.
    render_gids: dict[int, int] = field(default_factory=dict)


def helper_image() -> str:
    """The image the helper container runs (see the module's docstring)."""
    configured = getattr(settings, "DEVCLOUD_HOST_HELPER_IMAGE", "")
    if configured:
        return configured
    from portal.instances.catalog import image_reference

    # Under IMAGE_REGISTRY a new host pulls it from there before its first discovery.
    return image_reference("cpu", registry=getattr(settings, "IMAGE_REGISTRY", ""))


# --- Reading ------------------------------------------------------------------------------------------


def gpu_survey(host) -> GpuSurvey:
    """The host's GPUs (KFD topology) and device gids: read here for this machine's engine, through the
    host's engine otherwise. Raises InventoryError (HostFilesError when the engine is at fault)."""
    if is_local_engine(host.docker_url):
        return _survey_here(host)
    return survey_through_engine(host)


def gpu_busy(host, render_minors) -> dict[int, int | None]:
    """gpu_busy_percent of each of the host's GPUs in `render_minors` (None where it cannot be read).

    Read here for this machine's engine, through the host's engine otherwise. Raises HostFilesError
    when the engine cannot run the helper.
    """
    minors = sorted(set(render_minors))
    if not minors:
        return {}
    if is_local_engine(host.docker_url):
        return {minor: _busy_file(Path(host.sysfs_root or "/"), minor) for minor in minors}
    return busy_through_engine(host, minors)


def instances_gpu_busy(instance_ids) -> dict:
    """instance id -> the highest gpu_busy_percent among the GPUs it holds, or None when unknown.

    One read per host (one helper container for a remote host, however many instances it runs). A
    host whose engine cannot show the files leaves its instances unknown, and is logged. An instance on
    a Slurm partition has its job's own reading from its node (its last report, while that is recent).
    """
    from .models import GpuAllocation

    percents: dict = _slurm_jobs_gpu_busy(instance_ids)

    rows = GpuAllocation.objects.filter(
        instance_id__in=instance_ids, released_at__isnull=True
    ).select_related("gpu__host")
    hosts, held = {}, {}
    for allocation in rows:
        host = allocation.gpu.host
        hosts[host.pk] = host
        minors = held.setdefault(host.pk, {}).setdefault(allocation.instance_id, [])
        minors.append(allocation.gpu.render_minor)
    for host_id, by_instance in held.items():
        host = hosts[host_id]
        try:
            readings = gpu_busy(host, [minor for minors in by_instance.values() for minor in minors])
        except HostFilesError as error:
            logger.warning("GPU use on host %s is unknown this round: %s", host.name, error)
            readings = {}
        for instance_id, minors in by_instance.items():
            values = [readings[minor] for minor in minors if readings.get(minor) is not None]
            percents[instance_id] = max(values) if values else None
    return percents


def _slurm_jobs_gpu_busy(instance_ids) -> dict:
    """instance id -> the busy percent its Slurm job last reported, for jobs that reported within three
    heartbeats (an older reading says nothing about now: unknown, None)."""
    from datetime import timedelta

    from django.utils import timezone

    from .models import SlurmJob

    fresh = timezone.now() - timedelta(seconds=3 * settings.SLURM_JOB_HEARTBEAT_SECONDS)
    jobs = SlurmJob.objects.filter(instance_id__in=instance_ids, ended_at__isnull=True)
    return {
        job.instance_id: job.gpu_busy_percent if job.last_seen_running_at and job.last_seen_running_at >= fresh else None
        for job in jobs.only("instance_id", "gpu_busy_percent", "last_seen_running_at")
    }


def _survey_here(host) -> GpuSurvey:
    gpus = read_inventory(host.sysfs_root or "/")
    root = Path(host.dev_root or "/")
    survey = GpuSurvey(gpus=gpus, kfd_gid=_gid(root / "dev" / "kfd"))
    for gpu in gpus:
        gid = _gid(root / "dev" / "dri" / f"renderD{gpu.drm_render_minor}")
        if gid is not None:
            survey.render_gids[gpu.drm_render_minor] = gid
    return survey


def _gid(path: Path) -> int | None:
    try:
        return os.stat(path).st_gid
    except OSError:
        return None


def _busy_file(sysfs_root: Path, minor: int) -> int | None:
    path = sysfs_root / "sys" / "class" / "drm" / f"renderD{minor}" / "device" / "gpu_busy_percent"
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def survey_through_engine(host) -> GpuSurvey:
    """gpu_survey read by a helper container on the host's engine, whatever kind of engine it is."""
    output = _run_helper(host, "survey", [], dev=True)
    files, gids, _ = _parse(output, host)
    label = f"{host.name}:{host.sysfs_root or '/'}"
    gpus = inventory_from(SnapshotTree(files, label))
    survey = GpuSurvey(gpus=gpus, kfd_gid=gids.get("dev/kfd"))
    for gpu in gpus:
        gid = gids.get(f"dev/dri/renderD{gpu.drm_render_minor}")
        if gid is not None:
            survey.render_gids[gpu.drm_render_minor] = gid
    return survey


def busy_through_engine(host, render_minors) -> dict[int, int | None]:
    """gpu_busy read by a helper container on the host's engine, whatever kind of engine it is."""
    minors = sorted(set(int(minor) for minor in render_minors))
    _, _, busy = _parse(_run_helper(host, "busy", [str(minor) for minor in minors], dev=False), host)
    return {minor: busy.get(minor) for minor in minors}


def _parse(output: str, host) -> tuple[dict[str, str], dict[str, int], dict[int, int | None]]:
    """(files by path, gids by device path, busy percent by minor) from the helper's output."""
    files: dict[str, str] = {}
    gids: dict[str, int] = {}
    busy: dict[int, int | None] = {}
    current = None
    ended = False
    for line in output.splitlines():
        if line.startswith("@file "):
            current = line[len("@file ") :]
            files[current] = ""
        elif line.startswith("@gid "):
            current = None
            path, _, gid = line[len("@gid ") :].rpartition(" ")
            if gid.isdigit():
                gids[path] = int(gid)
        elif line.startswith("@busy "):
            current = None
            minor, _, value = line[len("@busy ") :].partition(" ")
            busy[int(minor)] = int(value) if value.strip().isdigit() else None
        elif line == "@end":
            ended = True
            current = None
        elif current is not None:
            files[current] += line + "\n"
    if not ended:
        raise HostFilesError(f"The helper container on host {host.name} was cut off before it finished.")
    return files, gids, busy


# --- The helper container -----------------------------------------------------------------------------


@contextmanager
def _client(host):
    """A client for the host's engine (its housekeeping connection), closed afterwards. Raises
    HostFilesError for unusable settings or an engine that cannot be reached."""
    from .drivers.docker_engine import DockerEngine

    engine = DockerEngine(host)
    try:
        client = engine.client(timeout=API_TIMEOUT_SECONDS)
    except DriverError as error:
        raise HostFilesError(error.message) from error
    try:
        yield client
    finally:
        client.close()


def _mounts(host, *, dev: bool) -> tuple[list[Mount], str]:
    """The read-only bind mounts of the host's paths, and the root the helper reads sys/ under."""
    mounts = []
    sysfs_root = host.sysfs_root or "/"
    root = ""
    if posixpath.normpath(sysfs_root) != "/":
        source = posixpath.join(sysfs_root, "sys")
        mounts.append(Mount(f"{HOST_MOUNT}/sys", source, type="bind", read_only=True))
        root = HOST_MOUNT
    if dev:
        dev_root = host.dev_root or "/"
        for name in ("dev/kfd", "dev/dri"):
            mounts.append(
                Mount(f"{HOST_MOUNT}/{name}", posixpath.join(dev_root, name), type="bind", read_only=True)
            )
    return mounts, root


def _ensure_image(client, host, image: str) -> None:
    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    first = image.split("/", 1)[0]
    names_registry = "/" in image and ("." in first or ":" in first or first == "localhost")
    if names_registry:
        try:
            client.images.pull(image)
            return
        except docker.errors.APIError:
            pass
    raise HostFilesError(
        f"The helper image {image} is not on host {host.name}, and discovery and GPU telemetry run in it. "
        "Put it there (console: Pre-pull or build an image, the CPU image), then discover again."
    )


def _run_helper(host, mode: str, arguments: list[str], *, dev: bool) -> str:
    """Run the helper on the host's engine and return what it printed. Removes it whatever happens.

    Raises HostFilesError when the engine cannot be reached, the image is missing, a path to mount does
    not exist on the host, or the helper fails.
    """
    image = helper_image()
    mounts, root = _mounts(host, dev=dev)
    with _client(host) as client:
        container = None
        try:
            _ensure_image(client, host, image)
            container = client.containers.create(
                image,
                entrypoint=["sh", "-c", HELPER_SCRIPT, "devcloud-hostfs"],
                command=[mode, root, *arguments],
                name=f"devcloud-hostfs-{uuid.uuid4().hex[:12]}",
                # Not devcloud.managed: the reconciler's instance containers are something else.
                labels={
                    "devcloud.helper": "hostfs",
                    "devcloud.helper.reads": mode,
                    "devcloud.portal": install_id(),
                },
                user=HELPER_USER,
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                privileged=False,
                mem_limit=HELPER_MEMORY_BYTES,
                pids_limit=HELPER_PIDS,
                mounts=mounts,
                log_config={"type": "json-file", "config": {"max-size": "1m"}},
                detach=True,
            )
            container.start()
            result = container.wait(timeout=HELPER_TIMEOUT_SECONDS)
            output = container.logs(stdout=True, stderr=False).decode("utf-8", errors="replace")
            if result.get("StatusCode") != 0:
                errors = container.logs(stdout=False, stderr=True).decode("utf-8", errors="replace")
                raise HostFilesError(
                    f"The helper container on host {host.name} failed ({result.get('StatusCode')}): "
                    f"{errors.strip()[:300]}"
                )
            return output
        except docker.errors.APIError as error:
            explanation = str(error.explanation or error)
            if "bind source path does not exist" in explanation:
                raise HostFilesError(
                    f"Host {host.name} has no {explanation.rsplit(':', 1)[-1].strip()}: is the amdgpu driver "
                    "loaded, and are the host's sysfs and device roots right?"
                ) from error
            raise HostFilesError(
                f"The Docker engine of host {host.name} refused the helper: {explanation}"
            ) from error
        except (docker.errors.DockerException, requests.RequestException, OSError) as error:
            raise HostFilesError(
                f"Cannot reach the Docker engine of host {host.name} ({host.docker_url}): {error}"
            ) from error
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except (docker.errors.DockerException, requests.RequestException):
                    pass


# --- GPU health (provisioning/gpu_health.py) -----------------------------------------------------------


@dataclass(frozen=True)
class GpuHealthReading:
    """What one heartbeat read of one GPU: whether the KFD topology still lists it (a GPU that stopped
    answering drops out of it), whether its device node exists, and the sums of the "ue:" and "ce:"
    lines of its amdgpu RAS counters (ras/*_err_count under its PCI device), None when it has none."""

    render_minor: int
    listed: bool
    device_node: bool
    ras_uncorrectable: int | None
    ras_correctable: int | None


def gpu_health(host, render_minors) -> dict[int, GpuHealthReading]:
    """render minor -> GpuHealthReading for each of `render_minors` on the host.

    Read here for this machine's engine, through the host's engine otherwise. Raises InventoryError
    (HostFilesError when the engine is at fault) when the host shows no KFD topology or no dev/dri at
    all: that says nothing about one GPU, so no GPU is judged on it.
    """
    minors = sorted(set(int(minor) for minor in render_minors))
    if is_local_engine(host.docker_url):
        sysfs_root, dev_root = Path(host.sysfs_root or "/"), Path(host.dev_root or "/")
        dri = dev_root / "dev" / "dri"
        if not dri.is_dir():
            raise HostFilesError(f"Host {host.name} has no {dri}: are the host's device root and amdgpu right?")
        listed = {gpu.drm_render_minor for gpu in inventory_from(LocalTree(sysfs_root))}
        files = {}
        for minor in minors:
            ras = sysfs_root / _ras_dir(minor)
            for path in sorted(ras.glob("*_err_count")) if ras.is_dir() else []:
                try:
                    files[f"{_ras_dir(minor)}/{path.name}"] = path.read_text()
                except OSError:
                    continue
        nodes = {minor for minor in minors if (dri / f"renderD{minor}").exists()}
    else:
        output = _run_helper(host, "health", [str(minor) for minor in minors], dev=True)
        files, nodes, has_dri = _parse_health(output, host)
        if not has_dri:
            raise HostFilesError(f"Host {host.name} shows no dev/dri: are the host's device root and amdgpu right?")
        listed = {gpu.drm_render_minor for gpu in inventory_from(SnapshotTree(files, f"{host.name}:{host.sysfs_root or '/'}"))}
    readings = {}
    for minor in minors:
        uncorrectable, correctable = ras_counts(
            [text for path, text in files.items() if path.startswith(_ras_dir(minor) + "/")]
        )
        readings[minor] = GpuHealthReading(
            render_minor=minor,
            listed=minor in listed,
            device_node=minor in nodes,
            ras_uncorrectable=uncorrectable,
            ras_correctable=correctable,
        )
    return readings


def _ras_dir(minor: int) -> str:
    # renderD<minor>/device is the GPU's PCI device, the same directory as card<N>/device.
    return f"sys/class/drm/renderD{minor}/device/ras"


def ras_counts(texts) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable): the sums of the "ue: N" and "ce: N" lines of amdgpu's
    ras/<block>_err_count files (`texts`, one per file). (None, None) when there are none; lines of
    other forms ("de: N", deferred errors on newer kernels) are left out."""
    if not texts:
        return None, None
    totals = {"ue": 0, "ce": 0}
    for text in texts:
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() in totals and value.strip().isdigit():
                totals[name.strip()] += int(value.strip())
    return totals["ue"], totals["ce"]


def _parse_health(output: str, host) -> tuple[dict[str, str], set[int], bool]:
    """(files by path, render minors whose device node exists, whether dev/dri exists) from the
    helper's output in health mode."""
    files: dict[str, str] = {}
    nodes: set[int] = set()
    has_dri = ended = False
    current = None
    for line in output.splitlines():
        if line.startswith("@file "):
            current = line[len("@file ") :]
            files[current] = ""
        elif line.startswith("@node "):
            current = None
            nodes.add(int(line[len("@node ") :]))
        elif line == "@dri":
            current, has_dri = None, True
        elif line == "@end":
            current, ended = None, True
        elif current is not None:
            files[current] += line + "\n"
    if not ended:
        raise HostFilesError(f"The helper container on host {host.name} was cut off before it finished.")
    return files, nodes, has_dri
