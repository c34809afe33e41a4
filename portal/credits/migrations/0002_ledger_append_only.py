"""The database itself refuses UPDATE and DELETE on ledger rows (design.md, "Credits").

TRUNCATE stays possible: it is a superuser maintenance operation, and test isolation needs it.
"""

from django.db import migrations

POSTGRES_FORWARD = """
CREATE OR REPLACE FUNCTION credits_ledger_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'credits_ledgerentry is append-only: % refused; post a correcting entry instead', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER credits_ledger_append_only
    BEFORE UPDATE OR DELETE ON credits_ledgerentry
    FOR EACH ROW EXECUTE FUNCTION credits_ledger_refuse_change();
"""
POSTGRES_BACKWARD = """
DROP TRIGGER IF EXISTS credits_ledger_append_only ON credits_ledgerentry;
DROP FUNCTION IF EXISTS credits_ledger_refuse_change();
"""
SQLITE_FORWARD = [
    """CREATE TRIGGER credits_ledger_no_update BEFORE UPDATE ON credits_ledgerentry
       BEGIN SELECT RAISE(ABORT, 'credits_ledgerentry is append-only: UPDATE refused'); END;""",
    """CREATE TRIGGER credits_ledger_no_delete BEFORE DELETE ON credits_ledgerentry
       BEGIN SELECT RAISE(ABORT, 'credits_ledgerentry is append-only: DELETE refused'); END;""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS credits_ledger_no_update;",
    "DROP TRIGGER IF EXISTS credits_ledger_no_delete;",
]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        # A plain cursor: the function body's "%" is not a query placeholder.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(POSTGRES_FORWARD)
    elif vendor == "sqlite":
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(POSTGRES_BACKWARD)
    elif vendor == "sqlite":
        for statement in SQLITE_BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("credits", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
