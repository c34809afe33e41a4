"""The "Operators" group: the operator actions and the console's view permissions, and nothing that edits
users, groups or permissions (see portal.console.operators)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from portal.console.operators import ADDED_WITH_SLURM, OPERATOR_PERMISSIONS, operators_group_seed

# The list as this migration first gave it; later migrations add what came after.
PERMISSIONS_THEN = tuple(
    name for name in OPERATOR_PERMISSIONS if not name.startswith("sshgateway.") and name not in ADDED_WITH_SLURM
)


def seed(apps, schema_editor):
    # Permissions are normally created after the last migration (post_migrate); the group needs them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    operators_group_seed(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"), PERMISSIONS_THEN)


def unseed(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="Operators").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0003_operator_actions"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("accounts", "0003_user_suspension_and_extra_sizes"),
        ("credits", "0004_certificate_imports"),
        ("instances", "0003_launchpolicy"),
        ("provisioning", "0002_image_jobs"),
        ("notifications", "0001_initial"),
    ]
    operations = [migrations.RunPython(seed, unseed)]
