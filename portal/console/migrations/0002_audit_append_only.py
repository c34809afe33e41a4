"""The database itself refuses UPDATE and DELETE on audit entries: the log is a record of what happened."""

from django.db import migrations

from portal.lib.append_only import refuse_update_and_delete


class Migration(migrations.Migration):
    dependencies = [("console", "0001_initial")]
    operations = [
        refuse_update_and_delete(
            table="console_auditentry", name="console_audit", hint="record a new entry instead"
        )
    ]
