"""Operators read the SSH gateway's session list (who reached which instance, when, how many bytes)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from portal.console.operators import ADDED_WITH_SLURM, OPERATOR_PERMISSIONS, operators_group_seed


def seed(apps, schema_editor):
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    # The group as it was then: what later migrations add needs models this one may run before.
    permissions = [name for name in OPERATOR_PERMISSIONS if name not in ADDED_WITH_SLURM]
    operators_group_seed(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"), permissions)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0005_periodic_task_runs"),
        ("sshgateway", "0001_initial"),
    ]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
