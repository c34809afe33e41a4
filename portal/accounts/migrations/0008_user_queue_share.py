from decimal import Decimal

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0007_user_project_bot"),
    ]

    operations = [
        migrations.AddField(
            model_name="user",
            name="queue_share",
            field=models.DecimalField(
                decimal_places=2,
                default=1,
                help_text="Weight in the queue's fair share (default 1): recent GPU use is divided by it, so 2 "
                "queues this person as if they had used half as much, 0.5 as if twice as much.",
                max_digits=6,
                validators=[django.core.validators.MinValueValidator(Decimal("0.01"))],
            ),
        ),
        migrations.AddConstraint(
            model_name="user",
            constraint=models.CheckConstraint(
                condition=models.Q(queue_share__gt=0), name="accounts_user_queue_share_positive"
            ),
        ),
    ]
