"""A never-reused key per person that names their workspace (provisioning/workspaces.py).

Added empty, filled with a fresh UUID per existing row, then made unique and required: a single default
would give every existing account the same key.
"""

import uuid

from django.db import migrations, models


def fill_keys(apps, schema_editor):
    User = apps.get_model("accounts", "User")
    for pk in User.objects.filter(workspace_key__isnull=True).values_list("pk", flat=True):
        User.objects.filter(pk=pk).update(workspace_key=uuid.uuid4())


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0005_credential_origin"),
    ]

    operations = [
        migrations.AddField(
            model_name="user",
            name="workspace_key",
            field=models.UUIDField(null=True, editable=False),
        ),
        migrations.RunPython(fill_keys, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="user",
            name="workspace_key",
            field=models.UUIDField(default=uuid.uuid4, unique=True, editable=False),
        ),
    ]
