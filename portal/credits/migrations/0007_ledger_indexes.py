"""Ledger indexes that match how the ledger is read, and no more: every index is written by every entry,
and the meter tick writes one entry per running instance per tick.

- (account, -created_at, -id) replaces (account, -created_at): the dashboard's latest entries come in
  the model's order (newest first, then id) straight from the index.
- The account_id index goes: the index above starts with account.
- The varchar_pattern_ops copy of the idempotency key's unique index goes (PostgreSQL): it serves only
  LIKE 'prefix%' lookups, and nothing looks keys up that way; the unique index stays.
"""

from django.db import migrations, models

LIKE_INDEX = "credits_ledgerentry_idempotency_key_3e28e170_like"


def drop_like_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {LIKE_INDEX}")


def restore_like_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {LIKE_INDEX} ON credits_ledgerentry "
            "(idempotency_key varchar_pattern_ops)"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("credits", "0006_approval_basis_constraints"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="ledgerentry",
            index=models.Index(fields=["account", "-created_at", "-id"], name="credits_ledger_account_latest"),
        ),
        migrations.RemoveIndex(model_name="ledgerentry", name="credits_led_account_ed8404_idx"),
        migrations.AlterField(
            model_name="ledgerentry",
            name="account",
            field=models.ForeignKey(
                db_index=False,
                on_delete=models.deletion.PROTECT,
                related_name="entries",
                to="credits.creditaccount",
            ),
        ),
        migrations.RunPython(drop_like_index, restore_like_index),
    ]
