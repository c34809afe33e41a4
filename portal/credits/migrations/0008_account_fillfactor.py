"""The accounts table keeps 30% of each page free (PostgreSQL's fillfactor).

The meter tick updates the balance of every owner with a running instance once a tick. Balance and
updated_at are in no index, so with room on the page PostgreSQL writes the new row version beside the
old one without touching the indexes (a heap-only update), as for the instances table
(`portal/instances/migrations/0006_metering_writes.py`). Pages written before this migration get that room as vacuum frees them.
"""

from django.db import migrations

FILLFACTOR = 70


def set_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE credits_creditaccount SET (fillfactor = {FILLFACTOR})")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE credits_creditaccount RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("credits", "0007_ledger_indexes"),
    ]

    operations = [
        migrations.RunPython(set_fillfactor, reset_fillfactor),
    ]
