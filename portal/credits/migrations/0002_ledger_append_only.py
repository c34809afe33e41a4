"""The database itself refuses UPDATE and DELETE on ledger rows (docs/architecture.md, "Credits")."""

from django.db import migrations

from portal.lib.append_only import refuse_update_and_delete


class Migration(migrations.Migration):
    dependencies = [("credits", "0001_initial")]
    operations = [
        refuse_update_and_delete(
            table="credits_ledgerentry", name="credits_ledger", hint="post a correcting entry instead"
        )
    ]
