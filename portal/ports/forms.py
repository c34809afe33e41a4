from django import forms

from .services import SHARE_DEFAULT_HOURS, SHARE_MAX_HOURS


class ExposeForm(forms.Form):
    port = forms.IntegerField(
        label="Port", help_text="The port your app listens on, on 0.0.0.0: 1024 to 65535."
    )


class ShareForm(forms.Form):
    hours = forms.IntegerField(
        label="Works for (hours)", min_value=1, max_value=SHARE_MAX_HOURS, initial=SHARE_DEFAULT_HOURS
    )
    email = forms.EmailField(
        label="Only for", required=False, help_text="A DevCloud account's email; empty: anyone with the link."
    )
