"""The launch form. It only checks that both choices were made; instance_launch judges them, so a forged
or stale choice (a disabled image, a size the image does not allow) gets the service's clear message."""

from django import forms


class LaunchForm(forms.Form):
    size = forms.CharField(max_length=10, error_messages={"required": "Choose a size."})
    image = forms.CharField(max_length=50, error_messages={"required": "Choose an image."})
