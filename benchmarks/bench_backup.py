"""Backup and restore time: `manage.py backup` / `restore` (portal/console/backup.py) against the plainest
copy of the same data.

Data: USERS accounts with LEDGER_PER_USER ledger rows each (1,000,000 rows), and WORKSPACES workspace
volumes of random bytes on this machine's Docker engine, WORKSPACE_BYTES in all (1 GiB).
Measured, median of RUNS each, in the same run on the same database and engine:
- backup: backup_make (pg_dump's custom format, then each volume streamed as tar through a helper
  container and the engine's archive API, with its sha256);
- backup baseline: `pg_dump --format=custom` plus `cp -a` of the volumes' directories on this machine
  (what an operator with root on the host could do by hand, with nothing checked);
- restore: backup_restore with --replace-database and --replace-workspaces (the schema dropped,
  pg_restore, each tar checked and unpacked into a new volume through the engine);
- restore baseline: the schema dropped, the same pg_restore command, and `cp -a` back into the volumes.
"""

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

USERS = 10_000
LEDGER_PER_USER = 100
WORKSPACES = 8
WORKSPACE_BYTES = 1024 * 1024 * 1024
RUNS = 3
PORTAL_ID = "devcloud-bench-backup"


def _seed(client, image: str) -> list:
    """Accounts, ledger rows, a host row for this machine's engine and the workspace volumes; returns them."""
    from django.db import connection
    from django.utils import timezone

    from portal.accounts.models import User
    from portal.credits.models import CreditAccount, LedgerEntry
    from provisioning.drivers.docker_engine import volume_labels, volume_name
    from provisioning.models import GpuHost

    users = User.objects.bulk_create(
        [User(email=f"dev{n}@example.com", password="!") for n in range(USERS)], batch_size=2000
    )
    CreditAccount.objects.bulk_create(
        [CreditAccount(user=user, balance_gpu_seconds=50 * 3600) for user in users], batch_size=2000
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {LedgerEntry._meta.db_table}
                (account_id, kind, gpu_seconds, balance_after, idempotency_key, reason, actor_name, created_at)
            SELECT account.id, 'usage', -60, 50 * 3600 - n * 60, 'seed:' || account.id || ':' || n,
                '1x MI300X instance: 60 s', 'system', %s
            FROM {CreditAccount._meta.db_table} account CROSS JOIN generate_series(1, %s) AS n
            """,
            [timezone.now(), LEDGER_PER_USER],
        )
    GpuHost.objects.create(name="bench-local", docker_url="unix:///var/run/docker.sock")
    volumes = []
    each = WORKSPACE_BYTES // WORKSPACES
    for user in users[:WORKSPACES]:
        volume = client.volumes.create(
            volume_name(user.workspace_key.hex), labels=volume_labels(user.id, user.workspace_key.hex)
        )
        client.containers.run(
            image,
            entrypoint=["sh", "-c", f"head -c {each} /dev/urandom > /workspace/data.bin"],
            user="1000:1000",
            network_mode="none",
            volumes={volume.name: {"bind": "/workspace", "mode": "rw"}},
            remove=True,
        )
        volumes.append(volume)
    return volumes


def _pg_env() -> dict:
    from portal.console.backup import _pg_environ

    return _pg_environ()


def _drop_schema():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
    connection.close()


def _baseline_backup(target: Path, volumes) -> None:
    subprocess.run(
        ["pg_dump", "--format=custom", "--no-owner", "--file", str(target / "database.dump")],
        env=_pg_env(), check=True,
    )  # fmt: skip
    for volume in volumes:
        subprocess.run(["cp", "-a", volume.attrs["Mountpoint"], str(target / volume.name)], check=True)


def _baseline_restore(target: Path, volumes) -> None:
    from django.db import connection

    _drop_schema()
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    subprocess.run(
        ["pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", f"--jobs={jobs}",
         f"--dbname={connection.settings_dict['NAME']}", str(target / "database.dump")],
        env=_pg_env(), check=True,
    )  # fmt: skip
    for volume in volumes:
        mountpoint = volume.attrs["Mountpoint"]
        shutil.rmtree(mountpoint)
        subprocess.run(["cp", "-a", str(target / volume.name), mountpoint], check=True)


def _timed(function) -> float:
    began = time.perf_counter()
    function()
    return time.perf_counter() - began


def main() -> dict:
    import docker

    from benchmarks import scratch_database
    from django.conf import settings

    from tests.support.images import build_cpu_image

    image = build_cpu_image()
    settings.DEVCLOUD_PORTAL_ID = PORTAL_ID
    settings.DEVCLOUD_HOST_HELPER_IMAGE = image
    client = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=600)
    scratch = Path(tempfile.mkdtemp(prefix="bench-backup-", dir="/var/tmp"))
    from portal.console.backup import backup_make, backup_restore

    quiet = lambda line: None  # noqa: E731
    times = {"backup": [], "backup_baseline": [], "restore": [], "restore_baseline": [], "backup_database": []}
    try:
        with scratch_database("bench_backup"):
            began = time.perf_counter()
            volumes = _seed(client, image)
            print(f"   seeded {USERS} users, {USERS * LEDGER_PER_USER} ledger rows, {WORKSPACES} volumes of "
                  f"{WORKSPACE_BYTES // WORKSPACES >> 20} MiB in {time.perf_counter() - began:.0f} s", flush=True)
            for run in range(RUNS):
                ours, plain = scratch / f"ours-{run}", scratch / f"plain-{run}"
                plain.mkdir()
                lines = []
                times["backup"].append(_timed(lambda: backup_make(ours, say=lines.append)))
                # The database's share, from backup_make's own line ("Database: 93.1 MB in 3.2 s").
                times["backup_database"].append(
                    next(float(line.split(" in ")[1].split()[0]) for line in lines if line.startswith("Database:"))
                )
                times["backup_baseline"].append(_timed(lambda: _baseline_backup(plain, volumes)))
                times["restore"].append(
                    _timed(lambda: backup_restore(ours, replace_database=True, replace_workspaces=True, say=quiet))
                )
                for volume in volumes:
                    volume.reload()
                times["restore_baseline"].append(_timed(lambda: _baseline_restore(plain, volumes)))
                print("   run {}: backup {:.1f} s (baseline {:.1f} s), restore {:.1f} s (baseline {:.1f} s); "
                      "the database's share of the backup {:.1f} s".format(
                    run + 1, *(times[key][-1] for key in times)), flush=True)  # fmt: skip
                shutil.rmtree(ours)
                shutil.rmtree(plain)
            from django.db import connection

            connection.close()
    finally:
        for volume in client.volumes.list(filters={"label": f"devcloud.portal={PORTAL_ID}"}):
            volume.remove(force=True)
        shutil.rmtree(scratch, ignore_errors=True)
        client.close()
    medians = {key: round(statistics.median(values), 2) for key, values in times.items()}
    figures = {
        "backup_s": medians["backup"],
        "backup_baseline_s": medians["backup_baseline"],
        "backup_ratio": round(medians["backup"] / medians["backup_baseline"], 2),
        "backup_database_s": medians["backup_database"],
        "restore_s": medians["restore"],
        "restore_baseline_s": medians["restore_baseline"],
        "restore_ratio": round(medians["restore"] / medians["restore_baseline"], 2),
    }
    print(
        f"   medians of {RUNS}: backup {figures['backup_s']} s vs pg_dump + cp {figures['backup_baseline_s']} s "
        f"(x{figures['backup_ratio']}); restore {figures['restore_s']} s vs pg_restore + cp "
        f"{figures['restore_baseline_s']} s (x{figures['restore_ratio']})"
    )
    return figures
