"""What a host's engine can limit (workspace volume sizes, writable layers), asked when it is registered or checked."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('provisioning', '0011_install_identity'),
    ]

    operations = [
        migrations.AddField(
            model_name='gpuhost',
            name='can_limit_workspaces',
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='gpuhost',
            name='can_limit_writable_layers',
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='gpuhost',
            name='disk_limits_checked_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='gpuhost',
            name='disk_limits_reason',
            field=models.TextField(blank=True, default=''),
        ),
        migrations.AddField(
            model_name='gpuhost',
            name='engine_storage',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
    ]
