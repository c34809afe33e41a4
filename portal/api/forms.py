"""The Settings page's form for a new personal access token."""

from django import forms
from django.conf import settings

from .models import ApiToken

EXPIRY_CHOICES = [(7, "7 days"), (30, "30 days"), (90, "90 days"), (365, "1 year")]


class ApiTokenForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        required=False,
        help_text="What uses it, e.g. “CI on GitHub” or “laptop”.",
        widget=forms.TextInput(attrs={"placeholder": "CI on GitHub", "autocomplete": "off"}),
    )
    scope = forms.ChoiceField(
        choices=ApiToken.Scope.choices,
        initial=ApiToken.Scope.READ,
        widget=forms.RadioSelect,
        help_text="“Read and launch” may also launch and stop instances, and change SSH keys and "
        "applications.",
    )
    days = forms.TypedChoiceField(label="Expires after", coerce=int, initial=30)

    def __init__(self, *args, **kwargs):
        # Ids of its own: the Settings page shows it beside the SSH key form, which also has a "name".
        kwargs.setdefault("auto_id", "id_token_%s")
        super().__init__(*args, **kwargs)
        self.fields["days"].choices = [
            (days, label) for days, label in EXPIRY_CHOICES if days <= settings.API_TOKEN_MAX_DAYS
        ] or [(settings.API_TOKEN_MAX_DAYS, f"{settings.API_TOKEN_MAX_DAYS} days")]
