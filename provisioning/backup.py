"""Workspaces into and out of a backup directory (`manage.py backup` / `restore`, portal/console/backup.py).

Every workspace this portal has on every host is written as one tar file under <target>/workspaces/:
  - a Docker host's volumes (labelled devcloud.portal=<this portal>): the engine streams each volume's
    /workspace as tar from a helper container that mounts it read-only and never starts (the archive
    API, as a move does: provisioning/workspaces.py); nothing is copied to this machine's disk but the
    tar itself, and the volume may stay mounted by a running instance (the copy is then as of that
    moment, file by file);
  - a Slurm cluster's workspace directories on its shared storage (<workspace_root>/<portal>-ws-*),
    which the portal sees: tarred from there.
Each file's entry records where it came from, its labels and driver options (the volume's size limit),
its size and sha256, so a restore puts it back as it was and can tell a damaged file.

Restore makes each volume again (with its labels and limit) and has the engine unpack the tar into it
through a helper; a directory is unpacked in place. A volume or directory that already holds files is
left alone unless `replace` is given.
"""

import hashlib
import logging
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import docker.errors

from .drivers.docker_engine import DockerEngine, cannot_limit, portal_id
from .models import GpuHost, SlurmCluster
from .workspaces import CHUNK_BYTES, WORKSPACE, _helper, helper_image, size_text, tally

logger = logging.getLogger(__name__)

WORKSPACES_DIR = "workspaces"


@dataclass
class WorkspaceArchive:
    """One workspace in a backup: a volume on a Docker host ("volume") or a Slurm workspace directory."""

    kind: str  # "volume" or "directory"
    place: str  # the GpuHost's name (volume) or the SlurmCluster's name (directory)
    name: str  # the volume's name, or the directory's name under the cluster's workspace_root
    file: str  # the tar, relative to the backup directory
    bytes: int = 0
    sha256: str = ""
    labels: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)


class BackupProblem(Exception):
    """A workspace could not be backed up or restored; the message says which and why."""


# --- Backup ------------------------------------------------------------------------------------------


def workspaces_backup(target: Path, *, say=print) -> tuple[list[WorkspaceArchive], list[str]]:
    """Writes every workspace of this portal under `target`/workspaces. Returns (archives, problems):
    a host that does not answer is a problem (its workspaces are missing from the backup), not an error."""
    archives, problems = [], []
    hosts = GpuHost.objects.exclude(state=GpuHost.State.RETIRED).filter(backend=GpuHost.Backend.DOCKER)
    for host in hosts:
        try:
            archives += _volumes_backup(host, target, say)
        except Exception as error:  # noqa: BLE001 -- reported, the other hosts go on
            problems.append(f"host {host.name}: {getattr(error, 'message', error)}")
    for cluster in SlurmCluster.objects.all():
        try:
            archives += _directories_backup(cluster, target, say)
        except OSError as error:
            problems.append(f"Slurm cluster {cluster.name}: {error}")
    return archives, problems


def _volumes_backup(host, target: Path, say) -> list[WorkspaceArchive]:
    engine = DockerEngine(host)
    client = engine.client()
    volumes = client.volumes.list(filters={"label": f"devcloud.portal={portal_id()}"})
    image = helper_image(client, _discovery_image()) if volumes else ""
    made = []
    for number, volume in enumerate(sorted(volumes, key=lambda v: v.name), 1):
        archive = WorkspaceArchive(
            kind="volume",
            place=host.name,
            name=volume.name,
            file=f"{WORKSPACES_DIR}/{_safe(host.name)}/{volume.name}.tar",
            labels=volume.attrs.get("Labels") or {},
            options=volume.attrs.get("Options") or {},
        )
        path = target / archive.file
        path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        helper = _helper(client, image, volume.name, writable=False)
        try:
            stream, _ = helper.get_archive(f"{WORKSPACE}/.", chunk_size=CHUNK_BYTES)
            archive.bytes, archive.sha256 = _write(path, stream)
        finally:
            helper.remove(force=True)
        say(
            f"  {host.name}: volume {number}/{len(volumes)} {volume.name}, {size_text(archive.bytes)} "
            f"in {time.monotonic() - began:.1f} s"
        )
        made.append(archive)
    return made


def _directories_backup(cluster, target: Path, say) -> list[WorkspaceArchive]:
    root = Path(cluster.workspace_root)
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(f"{portal_id()}-ws-"))
    made = []
    for number, name in enumerate(names, 1):
        archive = WorkspaceArchive(
            kind="directory",
            place=cluster.name,
            name=name,
            file=f"{WORKSPACES_DIR}/slurm-{_safe(cluster.name)}/{name}.tar",
        )
        path = target / archive.file
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w") as tar:
            tar.add(root / name, arcname=".")
        archive.bytes, archive.sha256 = _digest(path)
        say(f"  {cluster.name}: directory {number}/{len(names)} {name}, {size_text(archive.bytes)}")
        made.append(archive)
    return made


def _write(path: Path, chunks) -> tuple[int, str]:
    digest, written = hashlib.sha256(), 0
    with open(path, "wb") as handle:
        for chunk in chunks:
            handle.write(chunk)
            digest.update(chunk)
            written += len(chunk)
    return written, digest.hexdigest()


def _digest(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return path.stat().st_size, digest.hexdigest()


# --- Restore -----------------------------------------------------------------------------------------


def workspaces_restore(source: Path, archives: list[dict], *, replace: bool, say=print) -> list[str]:
    """Puts every archive back where it came from. Returns the problems (a missing host or cluster, a
    damaged tar, a volume or directory that already holds files and `replace` was not given); the others
    are restored all the same."""
    problems = []
    engines: dict[str, tuple] = {}
    for number, entry in enumerate(archives, 1):
        archive = WorkspaceArchive(**entry)
        path = source / archive.file
        began = time.monotonic()
        try:
            if _digest(path) != (archive.bytes, archive.sha256):
                raise BackupProblem(f"{archive.file} is damaged (its size or sha256 differs from the manifest)")
            if archive.kind == "volume":
                if archive.place not in engines:
                    engines[archive.place] = _engine_for(archive.place)
                _volume_restore(*engines[archive.place], archive, path, replace, say)
            else:
                _directory_restore(archive, path, replace)
        except BackupProblem as problem:
            problems.append(str(problem))
            continue
        except Exception as error:  # noqa: BLE001 -- reported, the other workspaces go on
            problems.append(f"{archive.name} on {archive.place}: {getattr(error, 'message', error)}")
            continue
        say(
            f"  {number}/{len(archives)} {archive.name} on {archive.place}, {size_text(archive.bytes)} "
            f"in {time.monotonic() - began:.1f} s"
        )
    return problems


def _engine_for(host_name: str):
    host = GpuHost.objects.filter(name=host_name).first()
    if host is None:
        raise BackupProblem(f"host {host_name} is not in the restored database")
    engine = DockerEngine(host)
    client = engine.client()
    return client, helper_image(client, _discovery_image())


def _volume_restore(client, image: str, archive: WorkspaceArchive, path: Path, replace: bool, say) -> None:
    try:
        existing = client.volumes.get(archive.name)
    except docker.errors.NotFound:
        existing = None
    if existing is not None:
        # Told to replace: no need to read the volume to learn whether it holds files.
        if not replace and tally(client, image, archive.name).entries > 1:
            raise BackupProblem(
                f"volume {archive.name} on {archive.place} already holds files; left as it is. Run restore "
                "with --replace-workspaces to replace it with the backup's copy."
            )
        existing.remove(force=True)
    try:
        client.volumes.create(archive.name, driver="local", driver_opts=archive.options, labels=archive.labels)
    except docker.errors.APIError as error:
        if not (archive.options and cannot_limit(error)):
            raise
        say(f"  {archive.place} cannot limit {archive.name}'s size ({error.explanation}); restored without it")
        client.volumes.create(archive.name, labels=archive.labels)
    helper = _helper(client, image, archive.name, writable=True)
    try:
        with open(path, "rb") as handle:
            helper.put_archive(WORKSPACE, handle)
    finally:
        helper.remove(force=True)


def _directory_restore(archive: WorkspaceArchive, path: Path, replace: bool) -> None:
    cluster = SlurmCluster.objects.filter(name=archive.place).first()
    if cluster is None:
        raise BackupProblem(f"Slurm cluster {archive.place} is not in the restored database")
    directory = Path(cluster.workspace_root) / archive.name
    if directory.exists() and any(directory.iterdir()):
        if not replace:
            raise BackupProblem(
                f"{directory} already holds files; left as it is. Run restore with --replace-workspaces "
                "to replace it with the backup's copy."
            )
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path) as tar:
        # The backup's own tar, made by _directories_backup: modes and owners come back as they were.
        tar.extractall(directory, filter="fully_trusted")


def _discovery_image() -> str:
    from .hostfs import helper_image as discovery_helper_image

    return discovery_helper_image()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def as_dicts(archives: list[WorkspaceArchive]) -> list[dict]:
    return [asdict(archive) for archive in archives]
