"""Placement on make run's embedded SQLite database, which has no GPU count triggers: the migrations apply,
and allocate() counts GPU rows there and keeps the same rules."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

PLACEMENTS = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)

from portal.accounts.models import User
from portal.instances.models import Image, Instance
from provisioning.models import Gpu, GpuHost
from provisioning.scheduler import allocate, release

user = User.objects.create(email="alice@example.com")
image = Image.objects.create(key="cpu", name="CPU", sizes=["1x", "8x"], reference="devcloud/cpu:test")
for name in ("gpu-a", "gpu-b"):
    host = GpuHost.objects.create(name=name)
    Gpu.objects.bulk_create(
        Gpu(host=host, node_id=n + 1, gpu_id=n, render_minor=128 + 8 * n) for n in range(8)
    )

def launch(size):
    instance = Instance.objects.create(user=user, size=size, image=image, state=Instance.State.QUEUED)
    allocations = allocate(instance_id=instance.pk) or []
    print(size, sorted({allocation.gpu.host.name for allocation in allocations}), len(allocations))
    return instance

ones = [launch("1x"), launch("1x")]
launch("8x")
launch("8x")
for instance in ones:
    release(instance_id=instance.pk)
launch("8x")
"""


def test_it_places_on_the_embedded_sqlite_database_by_counting_gpu_rows(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings.base",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'devcloud.sqlite3'}",
    }

    run = subprocess.run(
        [sys.executable, "-c", PLACEMENTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == [
        "1x ['gpu-a'] 1",
        "1x ['gpu-a'] 1",  # packs onto the host already in use
        "8x ['gpu-b'] 8",  # the whole free one
        "8x [] 0",  # no whole host left: it waits
        "8x ['gpu-a'] 8",  # the 1x launches gave theirs back
    ]
