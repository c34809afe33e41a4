"""Make a table append-only in the database itself: BEFORE UPDATE OR DELETE triggers that refuse the change.

Used by migrations of tables that are records of what happened (the credit ledger, the audit log), so
that no code path, admin action or stray SQL can rewrite history. TRUNCATE stays possible: it is a
superuser maintenance operation, and test isolation needs it.

    from portal.lib.append_only import refuse_update_and_delete

    operations = [refuse_update_and_delete(table="console_auditentry", name="console_audit")]
"""

from django.db import migrations


def postgres_sql(*, table: str, name: str, hint: str) -> tuple[str, str]:
    """Returns (forward, backward) SQL creating and dropping the PostgreSQL trigger `<name>_append_only`.

    The refusal raises SQLSTATE restrict_violation (23001), which Django reports as IntegrityError.
    Run it with a plain cursor: the function body's "%" is a RAISE placeholder, not a query parameter.
    """
    function = f"{name}_refuse_change"
    forward = f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '{table} is append-only: % refused; {hint}', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER {name}_append_only
    BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
"""
    backward = f"""
DROP TRIGGER IF EXISTS {name}_append_only ON {table};
DROP FUNCTION IF EXISTS {function}();
"""
    return forward, backward


def sqlite_sql(*, table: str, name: str) -> tuple[list[str], list[str]]:
    """Returns (forward, backward) statement lists for SQLite, the embedded default database."""
    forward = [
        f"""CREATE TRIGGER {name}_no_update BEFORE UPDATE ON {table}
       BEGIN SELECT RAISE(ABORT, '{table} is append-only: UPDATE refused'); END;""",
        f"""CREATE TRIGGER {name}_no_delete BEFORE DELETE ON {table}
       BEGIN SELECT RAISE(ABORT, '{table} is append-only: DELETE refused'); END;""",
    ]
    backward = [f"DROP TRIGGER IF EXISTS {name}_no_update;", f"DROP TRIGGER IF EXISTS {name}_no_delete;"]
    return forward, backward


def refuse_update_and_delete(
    *, table: str, name: str, hint: str = "append a new row instead"
) -> migrations.RunPython:
    """A migration operation installing the triggers on PostgreSQL or SQLite (other vendors: nothing).

    `name` prefixes the trigger and function names; `hint` ends the error message and says what to do
    instead (for the ledger: "post a correcting entry instead"). Reversible.
    """
    pg_forward, pg_backward = postgres_sql(table=table, name=name, hint=hint)
    lite_forward, lite_backward = sqlite_sql(table=table, name=name)

    def run(schema_editor, postgres: str, sqlite: list[str]):
        vendor = schema_editor.connection.vendor
        if vendor == "postgresql":
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(postgres)
        elif vendor == "sqlite":
            for statement in sqlite:
                schema_editor.execute(statement)

    def forward(apps, schema_editor):
        run(schema_editor, pg_forward, lite_forward)

    def backward(apps, schema_editor):
        run(schema_editor, pg_backward, lite_backward)

    return migrations.RunPython(forward, backward)
