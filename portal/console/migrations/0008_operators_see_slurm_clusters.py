"""Operators read the Slurm clusters' pages (their health and their nodes); registering one, or giving it a
new token, stays with superusers, as adding a GPU host does."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from portal.console.operators import operators_group_seed


def seed(apps, schema_editor):
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    operators_group_seed(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0007_auditentry_moves_to_audit"),
        ("provisioning", "0007_slurm_backend"),
    ]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
