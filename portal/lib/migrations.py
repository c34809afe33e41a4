"""Operations that several apps' migrations share."""

from django.db import migrations


def keep_page_room(table: str, *, fillfactor: int) -> migrations.RunPython:
    """Makes PostgreSQL fill `table`'s pages only to `fillfactor` percent (nothing on other databases).

    A row updated in columns that no index holds can then get its new version on the same page, without
    touching any index (a heap-only update). Applies to pages written from then on; older pages get the
    room as vacuum frees them.
    """

    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(fillfactor)})")

    def revert(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")

    return migrations.RunPython(apply, revert)
