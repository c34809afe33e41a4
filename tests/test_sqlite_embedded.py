"""make run's embedded SQLite database under the settings it ships: processes that write at the same
moment wait their turn instead of failing with "database is locked" (a Stop click racing the meter tick
once showed the newcomer Django's error page)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each process reads, waits so that the other reads too, then writes: with SQLite's deferred
# transactions both then hold a read lock, and one of them cannot take the write lock.
WRITER = """
import sys, time
import django
django.setup()
from django.db import connection, transaction
with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM clicks")
        time.sleep(0.5)
        cursor.execute("INSERT INTO clicks VALUES (%s)", [sys.argv[1]])
print("wrote", sys.argv[1])
"""

SETUP = """
import django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE clicks (who TEXT)")
    cursor.execute("PRAGMA journal_mode")
    print(cursor.fetchone()[0])
"""

COUNT = """
import django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT count(*) FROM clicks")
    print(cursor.fetchone()[0])
"""


def test_two_processes_writing_at_once_on_the_embedded_database_both_succeed(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings.base",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'devcloud.sqlite3'}",
    }

    def python(code, *args):
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    setup = python(SETUP)
    out, err = setup.communicate(timeout=60)
    assert setup.returncode == 0, err
    assert out.strip() == "wal"  # readers never wait for a writer

    writers = [python(WRITER, name) for name in ("web", "worker", "beat")]
    results = [(writer.communicate(timeout=60), writer.returncode) for writer in writers]

    for (out, err), code in results:
        assert code == 0, err[-2000:]
    count = python(COUNT)
    assert count.communicate(timeout=60)[0].strip() == "3"
