"""The launch form. It only checks that both choices were made; instance_launch judges them, so a forged
or stale choice (a disabled image, a size the image does not allow) gets the service's clear message."""

from django import forms


class LaunchForm(forms.Form):
    size = forms.CharField(max_length=10, error_messages={"required": "Choose a size."})
    image = forms.CharField(max_length=50, error_messages={"required": "Choose an image."})
    # A project's slug to pay from its pool; blank: the person pays.
    project = forms.CharField(max_length=50, required=False)
    # The API's only: a deadline of the launch's own (devcloud run --timeout); services checks its range.
    stop_after_seconds = forms.IntegerField(required=False)


class ExtendForm(forms.Form):
    """Hours to add to a running session; instance_extend judges the ceiling and the credit."""

    hours = forms.IntegerField(
        min_value=1, initial=1, error_messages={"required": "Say how many hours to add."}
    )
