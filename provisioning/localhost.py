"""This machine as a GPU host, so that `make run` can launch instances with no operator steps.

On a machine with AMD GPUs (the amdgpu driver's /sys/class/kfd exists) the machine is registered as it
is: its real KFD topology and its real /dev. Nothing is simulated there.

Anywhere else it becomes a *simulated* host: the 8x MI300X KFD topology of the repository's fixture (read
from a real host) and stand-in device nodes under the state folder, made like real ones (character
devices, group `render`, mode 0660) but with the numbers of /dev/null, so a container can open them and
nothing happens. Launches, placement, GPU isolation and metering then run end to end; no program sees a
GPU. The host is marked is_simulated, and every page that shows it says so.

Which catalogue images the host can start is recorded in HostImage rows: with the docker driver by asking
the engine, with the local driver (no engine) the images that need no GPU, since the local driver runs
JupyterLab from the portal's own environment. A missing default image is built by scripts/build-images.sh
(image_build_locally), tracked as an ImageJob so the launch page can show how far it got.
"""

import grp
import os
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.instances.models import Image

from . import services
from .drivers.docker_engine import DockerEngine
from .images import PROGRESS_LINES, host_images_record
from .inventory import read_inventory
from .models import GpuHost, ImageJob

# The machine's own root: its sysfs holds sys/class/kfd when the amdgpu driver is loaded.
MACHINE_ROOT = Path("/")
# Copied from a real 8x MI300X host; tests use the same tree.
SIMULATED_TOPOLOGY = Path(settings.BASE_DIR) / "tests" / "fixtures" / "kfd" / "mi300x-8gpu"
SIMULATED_HOST_NAME = "simulated-mi300x"
REAL_HOST_NAME = "this-machine"
LOCAL_ENGINE = "unix:///var/run/docker.sock"
# Character device numbers of /dev/null: a stand-in node can be opened, and reads and writes do nothing.
NULL_DEVICE = os.makedev(1, 3)
BUILD_SCRIPT = Path(settings.BASE_DIR) / "scripts" / "build-images.sh"


@dataclass
class LocalHost:
    """What local_host_ensure did: the host, whether it is simulated, and lines to tell the person."""

    host: GpuHost
    simulated: bool
    notes: list[str] = field(default_factory=list)


def render_gid() -> int:
    """gid of the `render` group, created when missing (as amdgpu's udev rules expect); `video` otherwise."""
    try:
        return grp.getgrnam("render").gr_gid
    except KeyError:
        pass
    if subprocess.run(["groupadd", "--system", "render"], capture_output=True).returncode == 0:
        return grp.getgrnam("render").gr_gid
    return grp.getgrnam("video").gr_gid


def standin_devices_make(root: Path, render_minors, *, gid: int | None = None) -> int:
    """Create root/dev/kfd and root/dev/dri/renderD<minor> as stand-in device nodes. Returns their gid.

    Each is a character device with /dev/null's numbers, owned by root and `gid` (the render group by
    default), mode 0660: like a real node, only a member of that group may open it. Idempotent.
    Raises PermissionError when not run as root (mknod needs CAP_MKNOD).
    """
    gid = render_gid() if gid is None else gid
    dri = root / "dev" / "dri"
    dri.mkdir(parents=True, exist_ok=True)
    for node in [root / "dev" / "kfd"] + [dri / f"renderD{minor}" for minor in render_minors]:
        if node.exists() and not stat.S_ISCHR(node.stat().st_mode):
            node.unlink()
        if not node.exists():
            os.mknod(node, stat.S_IFCHR | 0o660, NULL_DEVICE)
        os.chown(node, 0, gid)
        os.chmod(node, 0o660)
    return gid


def local_host_ensure(
    *, var_dir: Path, driver: str, docker_url: str = "", machine_root: Path = MACHINE_ROOT
) -> LocalHost:
    """Register this machine as a GPU host, or bring an earlier registration up to date. Idempotent.

    With real AMD GPUs (`machine_root`/sys/class/kfd exists) the host reads sysfs and /dev under
    `machine_root` ("/") and is not simulated;
    a simulated host left from an earlier run is then retired, so nothing lands on it. Without them the
    simulated host is used, its stand-in nodes under `var_dir`/simulated-gpus. An operator's drain or
    retirement of the host is kept. Returns the LocalHost.

    Raises services.HostError when the docker driver is used and the engine does not answer, and
    InventoryError when the topology cannot be read.
    """
    docker_url = docker_url or os.environ.get("DOCKER_HOST") or LOCAL_ENGINE
    notes = []
    kfd = machine_root / "sys" / "class" / "kfd"
    if kfd.exists():
        name, sysfs_root, dev_root, simulated = REAL_HOST_NAME, str(machine_root), str(machine_root), False
        retired = GpuHost.objects.filter(is_simulated=True).exclude(state=GpuHost.State.RETIRED)
        if retired.update(state=GpuHost.State.RETIRED, last_error="Real AMD GPUs were found on this machine."):
            notes.append(f"Retired the simulated host: this machine has real AMD GPUs ({kfd}).")
    else:
        name, sysfs_root, simulated = SIMULATED_HOST_NAME, str(SIMULATED_TOPOLOGY), True
        dev_root = var_dir / "simulated-gpus"
        minors = [gpu.drm_render_minor for gpu in read_inventory(SIMULATED_TOPOLOGY)]
        try:
            standin_devices_make(dev_root, minors)
        except PermissionError:
            if driver == "docker":
                notes.append(
                    f"Could not create stand-in GPU device nodes under {dev_root} (mknod needs root), so "
                    "containers cannot start. Run `make run` as root."
                )
        dev_root = str(dev_root)
    with transaction.atomic():
        host = GpuHost.objects.select_for_update().filter(name=name).first()
        if host is None:
            host = services.host_register(
                name=name,
                docker_url=docker_url,
                sysfs_root=sysfs_root,
                dev_root=dev_root,
                check=driver == "docker",
                discover=False,
            )
            notes.append(f"Registered this machine as GPU host {name}.")
        wanted = {
            "docker_url": docker_url,
            # The same rules as adding a host (no plain TCP, a unix socket publishes on this machine).
            "private_address": services.host_endpoint_check(
                docker_url=docker_url, private_address=host.private_address
            ),
            "sysfs_root": sysfs_root,
            "dev_root": dev_root,
            "is_simulated": simulated,
        }
        changed = [key for key, value in wanted.items() if getattr(host, key) != value]
        for key in changed:
            setattr(host, key, wanted[key])
        if changed:
            host.save(update_fields=changed)
    services.host_discover(host_id=host.pk)
    host.refresh_from_db()
    if host.state != GpuHost.State.ACTIVE:
        notes.append(
            f"GPU host {name} is {host.get_state_display().lower()} (an operator's choice, kept): reactivate it "
            "in the console to launch on it."
        )
    return LocalHost(host=host, simulated=simulated, notes=notes)


def local_images_survey(*, host: GpuHost, driver: str) -> dict[str, bool]:
    """Record which enabled catalogue images the host can start now. Returns {image key: present}.

    With the docker driver the engine is asked; with the local driver the images that need no GPU count
    as present (the local driver runs JupyterLab from the portal's own environment) and the rest as
    missing. Raises DriverError when the engine does not answer.
    """
    images = list(Image.objects.filter(is_enabled=True))
    if driver == "docker":
        tags = set(DockerEngine(host).images())
        present = {image.reference for image in images if image.reference in tags}
    else:
        present = {image.reference for image in images if not image.needs_gpu}
    host_images_record(host=host, references=[image.reference for image in images], present=present)
    return {image.key: image.reference in present for image in images}


# --- Building the default image in the background -------------------------------------------------------

# Rough shares of a cold build: debootstrap makes the base (about half), then `docker build` the image.
_DEBOOTSTRAP_MARKS = [
    ("debootstrap --variant", 2),
    ("I: Retrieving Release", 4),
    ("I: Retrieving Packages", 6),
    ("I: Resolving dependencies", 8),
    ("I: Retrieving", 10),
    ("I: Extracting", 25),
    ("I: Installing", 30),
    ("I: Unpacking", 35),
    ("I: Configuring", 40),
    ("I: Base system installed", 45),
    ("docker import", 48),
    ("is present", 50),
]


def build_percent(line: str, current: int | None) -> int | None:
    """How far a cold build of the image is, judged from one line of scripts/build-images.sh output.

    Returns the new percentage (never less than `current`), or `current` when the line says nothing new.
    """
    text = line.strip()
    found = None
    if text.startswith("Step ") and "/" in text.split()[1]:
        step, _, steps = text.split()[1].partition("/")
        if step.isdigit() and steps.isdigit() and int(steps):
            found = 50 + (int(step) - 1) * 50 // int(steps)
    else:
        for mark, percent in _DEBOOTSTRAP_MARKS:
            if mark in text:
                found = percent
                break
    if found is None:
        return current
    return max(found, current or 0)


def image_job_for_local_build(*, host: GpuHost, image: Image) -> ImageJob:
    """A running ImageJob for building `image` on this machine. A job left running by an earlier run that
    was stopped mid-build is marked failed first, saying so."""
    now = timezone.now()
    ImageJob.objects.filter(host=host, image=image, state__in=ImageJob.ACTIVE_STATES).update(
        state=ImageJob.State.FAILED,
        finished_at=now,
        error="The portal was stopped while this build ran; the next start built it again.",
    )
    return ImageJob.objects.create(
        host=host, image=image, reference=image.reference, state=ImageJob.State.RUNNING, started_at=now
    )


def image_build_locally(*, job_id: int, say: Callable[[str], None], python: str) -> bool:
    """Run scripts/build-images.sh for the job's image, passing each output line to `say` and keeping the
    job's progress (last lines, percent) up to date. Returns True when the image was built.

    On failure the job is marked failed with the last lines and what to do; nothing is raised.
    """
    job = ImageJob.objects.select_related("host", "image").get(pk=job_id)
    lines: list[str] = []
    percent = None
    written = 0.0
    process = subprocess.Popen(
        ["bash", str(BUILD_SCRIPT), job.image.key],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PYTHON": python},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    for raw in process.stdout:
        line = raw.rstrip()
        if not line:
            continue
        say(line)
        lines = (lines + [line[:300]])[-PROGRESS_LINES:]
        new_percent = build_percent(line, percent)
        now = timezone.now().timestamp()
        if new_percent != percent or now - written >= 1:
            percent, written = new_percent, now
            ImageJob.objects.filter(pk=job_id, state=ImageJob.State.RUNNING).update(
                progress_text="\n".join(lines), percent=percent, updated_at=timezone.now()
            )
    code = process.wait()
    now = timezone.now()
    if code == 0 and DockerEngine(job.host).has_image(job.reference):
        host_images_record(host=job.host, references=[job.reference], present={job.reference})
        ImageJob.objects.filter(pk=job_id).update(
            state=ImageJob.State.DONE,
            outcome="built",
            percent=100,
            finished_at=now,
            updated_at=now,
            progress_text="\n".join(lines),
        )
        return True
    ImageJob.objects.filter(pk=job_id).update(
        state=ImageJob.State.FAILED,
        finished_at=now,
        updated_at=now,
        progress_text="\n".join(lines),
        error=f"scripts/build-images.sh {job.image.key} failed (exit status {code}); its last lines say why. "
        f"Fix that, then run `bash scripts/build-images.sh {job.image.key}` as root, or restart `make run`.",
    )
    return False


def default_image_missing(survey: dict[str, bool]) -> Image | None:
    """The enabled default image when the survey found it missing, else None."""
    image = Image.objects.filter(is_enabled=True, is_default=True).first()
    if image is not None and not survey.get(image.key, True):
        return image
    return None

