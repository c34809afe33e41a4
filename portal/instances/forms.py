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


class ReservationForm(forms.Form):
    """A booking: how many GPUs and the window, in UTC; reservation_book judges everything else."""

    gpus = forms.IntegerField(
        label="GPUs (8: a whole host)",
        min_value=1,
        max_value=8,
        initial=8,
        error_messages={"required": "Say how many GPUs to book."},
    )
    starts_at = forms.DateTimeField(
        label="Starts (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        error_messages={
            "required": "Say when the window starts.",
            "invalid": "Give the start as a date and time.",
        },
    )
    ends_at = forms.DateTimeField(
        label="Ends (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        error_messages={
            "required": "Say when the window ends.",
            "invalid": "Give the end as a date and time.",
        },
    )
    # A project's slug to pay from its pool (owners only); blank: the person pays.
    project = forms.CharField(
        label="Project to pay (its slug; blank: you pay)", max_length=50, required=False
    )
