"""Stop reasons were free strings in two vocabularies ("credits exhausted", "operator: <words>"); they
become one set of words (portal/instances/stop_reasons.py) with the operator's words in stop_note."""

from django.db import migrations, models

# Old string -> new word, for the strings the code wrote.
RENAMED = {
    "user": "user",
    "credits exhausted": "credits_exhausted",
    "credits_exhausted": "credits_exhausted",
    "operator": "operator",
    "idle": "idle",
    "max_length": "max_length",
    "operator: account suspended": "suspended",
    "operator: host evicted": "host_evicted",
}
OPERATOR_PREFIX = "operator: "


def words_for(old: str) -> tuple[str, str]:
    """(reason, note) for an old stop_reason string."""
    if old in RENAMED:
        return RENAMED[old], ""
    if old.startswith(OPERATOR_PREFIX):
        return "operator", old.removeprefix(OPERATOR_PREFIX)[:200]
    # Nothing else was ever written; keep any stray text for the owner to read rather than lose it.
    return "operator", old[:200]


def forward(apps, schema_editor):
    Instance = apps.get_model("instances", "Instance")
    olds = Instance.objects.exclude(stop_reason="").values_list("stop_reason", flat=True).distinct()
    for old in list(olds):
        reason, note = words_for(old)
        Instance.objects.filter(stop_reason=old).update(stop_reason=reason, stop_note=note)


def backward(apps, schema_editor):
    Instance = apps.get_model("instances", "Instance")
    back = {"credits_exhausted": "credits exhausted", "suspended": "operator: account suspended",
            "host_evicted": "operator: host evicted"}
    for new, old in back.items():
        Instance.objects.filter(stop_reason=new).update(stop_reason=old)
    for instance in Instance.objects.filter(stop_reason="operator").exclude(stop_note=""):
        Instance.objects.filter(pk=instance.pk).update(stop_reason=f"{OPERATOR_PREFIX}{instance.stop_note}"[:200])
    Instance.objects.filter(stop_reason__in=["host_down", "account_deleted"]).update(stop_reason="operator")


class Migration(migrations.Migration):

    dependencies = [
        ("instances", "0003_launchpolicy"),
    ]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="stop_note",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.RunPython(forward, backward),
    ]
