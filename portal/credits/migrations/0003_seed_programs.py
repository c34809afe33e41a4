"""Seed the early-registrant grant and the ROCm Star bonus program, with values from settings."""

from datetime import datetime, timezone

from django.conf import settings
from django.db import migrations


def seed(apps, schema_editor):
    SignupGrantProgram = apps.get_model("credits", "SignupGrantProgram")
    BonusProgram = apps.get_model("credits", "BonusProgram")
    open_until = None
    if settings.SIGNUP_GRANT_OPEN_UNTIL:
        open_until = datetime.fromisoformat(settings.SIGNUP_GRANT_OPEN_UNTIL)
        if open_until.tzinfo is None:
            open_until = open_until.replace(tzinfo=timezone.utc)
    SignupGrantProgram.objects.get_or_create(
        name="Early-registrant grant",
        defaults={
            "gpu_seconds": settings.SIGNUP_GRANT_GPU_HOURS * 3600,
            "max_accounts": settings.SIGNUP_GRANT_MAX_ACCOUNTS,
            "open_until": open_until,
        },
    )
    BonusProgram.objects.get_or_create(
        slug="rocm-star",
        defaults={
            "name": "ROCm Star developer certificate",
            "description": "Earned the ROCm Star developer certificate? Give its ID or link and get up to 50 bonus GPU-hours.",
            "evidence_label": "Certificate ID or URL",
            "max_gpu_seconds": 50 * 3600,
        },
    )


class Migration(migrations.Migration):
    dependencies = [("credits", "0002_ledger_append_only")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
