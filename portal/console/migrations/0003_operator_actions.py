"""No table: the holder of the operator action permissions (see OperatorAction)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0002_audit_append_only'),
    ]

    operations = [
        migrations.CreateModel(
            name='OperatorAction',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ],
            options={
                'permissions': [('suspend_user', 'Can suspend a user'), ('unsuspend_user', "Can lift a user's suspension"), ('open_launch_sizes', 'Can open or close launch sizes for one user'), ('adjust_credits', "Can grant or correct a user's credits"), ('review_bonus', 'Can approve or reject bonus applications and import certificate IDs'), ('drain_host', 'Can drain a GPU host'), ('evict_host', 'Can cordon a GPU host and evict its instances'), ('retire_host', 'Can retire a GPU host'), ('activate_host', 'Can put a GPU host back into service'), ('discover_gpus', 'Can run GPU discovery on a host'), ('check_engine', "Can check a host's Docker engine"), ('ensure_images', 'Can pre-pull or build images on hosts'), ('force_stop_instance', 'Can force-stop an instance')],
                'managed': False,
                'default_permissions': (),
            },
        ),
    ]
