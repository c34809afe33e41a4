"""Each install's own id (provisioning/identity.py).

A fresh database gets a random one. A database that already has hosts or workspaces ran under the old
shared default "devcloud": it keeps that id, so the containers it is running are still found as its own
(its new people's workspaces are named by their never-reused key whatever the install id).
"""

import secrets

from django.db import migrations, models


def make_install_id(apps, schema_editor):
    Installation = apps.get_model("provisioning", "Installation")
    GpuHost = apps.get_model("provisioning", "GpuHost")
    Workspace = apps.get_model("provisioning", "Workspace")
    if Installation.objects.exists():
        return
    used_before = GpuHost.objects.exists() or Workspace.objects.exists()
    install_id = "devcloud" if used_before else f"dc-{secrets.token_hex(6)}"
    Installation.objects.create(pk=1, install_id=install_id)


class Migration(migrations.Migration):

    dependencies = [
        ("provisioning", "0010_sealed_host_keys"),
    ]

    operations = [
        migrations.CreateModel(
            name="Installation",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("install_id", models.CharField(max_length=40, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.RunPython(make_install_id, migrations.RunPython.noop),
    ]
