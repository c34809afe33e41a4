"""The accounts table keeps 30% of each page free (PostgreSQL's fillfactor).

The meter tick updates the balance of every owner with a running instance once a tick. Balance and
updated_at are in no index, so with room on the page PostgreSQL writes the new row version beside the
old one without touching the indexes (a heap-only update), as for the instances table
(`portal/instances/migrations/0006_metering_writes.py`). Pages written before this migration get that
room as vacuum frees them.
"""

from django.db import migrations

from portal.lib.migrations import keep_page_room


class Migration(migrations.Migration):
    dependencies = [
        ("credits", "0007_ledger_indexes"),
    ]

    operations = [
        keep_page_room("credits_creditaccount", fillfactor=70),
    ]
