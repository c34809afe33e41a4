"""The audit log's model now lives in portal.audit (its migration 0001 took over the table as it is). The
console keeps a proxy of it under the same name for its admin screen, so the content type
console.auditentry and its permissions, which the Operators group holds, stay where they are.
State only: the database does not change."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0006_operators_see_ssh_sessions"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="AuditEntry")]),
        # A proxy has no table: CreateModel does nothing to the database here.
        migrations.CreateModel(
            name="AuditEntry",
            fields=[],
            options={"verbose_name_plural": "audit entries", "proxy": True, "indexes": [], "constraints": []},
            bases=("audit.auditentry",),
        ),
    ]
