"""Seed the early-registrant grant and the ROCm Star bonus program, with values from settings."""

from django.db import migrations

from portal.credits.seed import seed_programs


def seed(apps, schema_editor):
    seed_programs(apps.get_model("credits", "SignupGrantProgram"), apps.get_model("credits", "BonusProgram"))


class Migration(migrations.Migration):
    dependencies = [("credits", "0002_ledger_append_only")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
