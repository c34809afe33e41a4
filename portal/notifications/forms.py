from django import forms

from .models import OPTIONAL_KINDS


class EmailPreferencesForm(forms.Form):
    """Which optional notifications the user wants by email. An unticked box turns that email off."""

    emailed_kinds = forms.MultipleChoiceField(
        label="Email me when",
        choices=[(kind.value, kind.label) for kind in OPTIONAL_KINDS],
        widget=forms.CheckboxSelectMultiple,
        required=False,
    )
