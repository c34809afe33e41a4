"""Cheaper writes for the meter tick, which updates every running instance once a tick.

- The state index and the user index go: (state, created_at) and (user, state) start with them. Every
  index is written whenever a row moves to a new version that an index must find.
- The table keeps 30% of each page free (PostgreSQL's fillfactor). The tick changes only metered_until
  and charged_gpu_seconds, which no index holds, so with room on the page PostgreSQL writes the new row
  version beside the old one and touches no index at all (a heap-only update). Pages written before
  this migration get that room as vacuum frees them.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from portal.lib.migrations import keep_page_room


class Migration(migrations.Migration):
    dependencies = [
        ("instances", "0005_stop_reason_choices"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="instance",
            name="state",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("provisioning", "Provisioning"),
                    ("running", "Running"),
                    ("stopping", "Stopping"),
                    ("stopped", "Stopped"),
                    ("failed", "Failed"),
                ],
                default="queued",
                max_length=20,
            ),
        ),
        migrations.AlterField(
            model_name="instance",
            name="user",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="instances",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        keep_page_room("instances_instance", fillfactor=70),
    ]
