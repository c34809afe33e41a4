"""Backups: the database and every workspace into one directory, and back (`manage.py backup` / `restore`).

A backup directory holds:
  manifest.json      what is in it: when, which database engine, each workspace tar with its size and
                     sha256 (provisioning/backup.py writes and restores the workspaces)
  database.dump      PostgreSQL: pg_dump's custom format (compressed; pg_restore loads it)
  database.sqlite3   SQLite (`make run`): a consistent copy through SQLite's online backup API
  workspaces/        one tar per workspace volume or Slurm workspace directory

Restore loads the database first (the workspaces' hosts are rows in it), then the workspaces. It refuses to
load into a database that already has tables unless told to replace it. The ledger's append-only
triggers (portal/lib/append_only.py) are no obstacle: pg_restore inserts the rows before it makes the
triggers, and replacing drops the schema, which deletes no row one by one.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

from django.db import connection
from django.utils import timezone

from provisioning.backup import as_dicts, workspaces_backup, workspaces_restore

MANIFEST = "manifest.json"
FORMAT = 1


class BackupError(Exception):
    """The backup or restore could not be made; the message says why and what to do."""


def _database() -> dict:
    return connection.settings_dict


def _vendor() -> str:
    return connection.vendor  # "postgresql" or "sqlite"


def _pg_environ() -> dict:
    database = _database()
    environ = dict(os.environ)
    for variable, key in (("PGHOST", "HOST"), ("PGPORT", "PORT"), ("PGUSER", "USER"), ("PGPASSWORD", "PASSWORD")):
        if database.get(key):
            environ[variable] = str(database[key])
    environ["PGDATABASE"] = database["NAME"]
    return environ


def _run(command: list[str], what: str) -> None:
    if shutil.which(command[0]) is None:
        raise BackupError(f"{command[0]} is not installed (Debian: apt-get install postgresql-client)")
    result = subprocess.run(command, env=_pg_environ(), capture_output=True, text=True)
    if result.returncode != 0:
        raise BackupError(f"{what} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")


# --- Backup ------------------------------------------------------------------------------------------


def backup_make(target: Path, *, say=print) -> dict:
    """Writes the database and every workspace into `target` (made if missing; it must be empty).

    Returns the manifest. Raises BackupError when `target` is not empty or the database dump fails. A host
    that does not answer does not stop the backup: its workspaces are listed under "problems".
    """
    target = Path(target)
    if target.exists() and any(target.iterdir()):
        raise BackupError(f"{target} is not empty. Give a new or empty directory, so no backup is overwritten.")
    target.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    manifest = {"format": FORMAT, "created_at": timezone.now().isoformat(), "database": _vendor()}
    say(f"Database ({_vendor()}) ...")
    if _vendor() == "postgresql":
        manifest["database_file"] = "database.dump"
        _run(["pg_dump", "--format=custom", "--no-owner", "--file", str(target / "database.dump")], "pg_dump")
    else:
        manifest["database_file"] = "database.sqlite3"
        source = sqlite3.connect(_database()["NAME"])
        copy = sqlite3.connect(target / "database.sqlite3")
        with copy:
            source.backup(copy)
        copy.close()
        source.close()
    size = (target / manifest["database_file"]).stat().st_size
    say(f"Database: {size / 1e6:.1f} MB in {time.monotonic() - began:.1f} s")
    say("Workspaces ...")
    archives, problems = workspaces_backup(target, say=say)
    manifest["workspaces"] = as_dicts(archives)
    manifest["problems"] = problems
    total = sum(archive.bytes for archive in archives)
    (target / MANIFEST).write_text(json.dumps(manifest, indent=1))
    say(
        f"Backed up the database and {len(archives)} workspaces ({total / 1e6:.1f} MB) to {target} in "
        f"{time.monotonic() - began:.1f} s."
    )
    for problem in problems:
        say(f"NOT BACKED UP: {problem}")
    return manifest


# --- Restore -----------------------------------------------------------------------------------------


def database_tables() -> int:
    """How many tables the database Django is configured with has."""
    with connection.cursor() as cursor:
        return len(connection.introspection.table_names(cursor))


def backup_restore(
    source: Path, *, replace_database: bool = False, replace_workspaces: bool = False, say=print
) -> list[str]:
    """Loads the backup in `source`: the database, then every workspace. Returns the workspaces' problems.

    Raises BackupError when `source` holds no backup, the backup is of another database engine, or the
    database already has tables and `replace_database` is false (nothing is changed then).
    """
    source = Path(source)
    try:
        manifest = json.loads((source / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise BackupError(f"{source} holds no readable backup ({MANIFEST}: {error}).") from error
    if manifest.get("database") != _vendor():
        raise BackupError(
            f"The backup is of a {manifest.get('database')} database and DATABASE_URL names a {_vendor()} "
            "one. Point DATABASE_URL at the kind the backup was made from."
        )
    began = time.monotonic()
    tables = database_tables()
    if tables and not replace_database:
        raise BackupError(
            f"The database {_database()['NAME']} already has {tables} tables; restoring would replace "
            "everything in it. Run restore again with --replace-database to drop them first, or point "
            "DATABASE_URL at a new, empty database."
        )
    say(f"Database ({_vendor()}) ...")
    if _vendor() == "postgresql":
        _postgres_restore(source / manifest["database_file"], drop=bool(tables))
    else:
        _sqlite_restore(source / manifest["database_file"])
    say(f"Database restored in {time.monotonic() - began:.1f} s")
    say(f"Workspaces ({len(manifest['workspaces'])}) ...")
    problems = workspaces_restore(source, manifest["workspaces"], replace=replace_workspaces, say=say)
    say(f"Restored the database and {len(manifest['workspaces']) - len(problems)} workspaces in {time.monotonic() - began:.1f} s.")
    for problem in problems:
        say(f"NOT RESTORED: {problem}")
    return problems


def _postgres_restore(dump: Path, *, drop: bool) -> None:
    if drop:
        # Drops every table with the schema: no row is deleted one by one, so the ledger's triggers
        # (BEFORE DELETE) never fire.
        with connection.cursor() as cursor:
            cursor.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
    connection.close()
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    _run(
        ["pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", f"--jobs={jobs}",
         f"--dbname={_database()['NAME']}", str(dump)],
        "pg_restore",
    )  # fmt: skip


def _sqlite_restore(copy: Path) -> None:
    connection.close()
    source = sqlite3.connect(copy)
    target = sqlite3.connect(_database()["NAME"])
    with target:
        source.backup(target)
    target.close()
    source.close()
