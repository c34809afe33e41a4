from django.db import migrations, models


def local_engines_publish_on_loopback(apps, schema_editor):
    # A unix:// engine is this machine's, and its containers always published on 127.0.0.1. A tcp://
    # host published on 0.0.0.0 until now; only its operator knows its private address, so it is left
    # empty and the docker driver refuses to launch there until the operator gives it.
    GpuHost = apps.get_model("provisioning", "GpuHost")
    GpuHost.objects.filter(docker_url__startswith="unix://", private_address__isnull=True).update(
        private_address="127.0.0.1"
    )


class Migration(migrations.Migration):

    dependencies = [
        ("provisioning", "0003_simulated_hosts_and_host_images"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpuhost",
            name="private_address",
            field=models.GenericIPAddressField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="gpuhost",
            name="kfd_gid",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="gpu",
            name="render_gid",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(local_engines_publish_on_loopback, migrations.RunPython.noop),
    ]
