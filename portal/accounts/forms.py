"""Forms check the shape of input; the rules (duplicates, password strength, key types) live in services."""

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from .login_names import normalise_login_name


def _email_field(label="Email address", **attrs):
    return forms.EmailField(
        label=label,
        max_length=254,
        widget=forms.EmailInput(attrs={"autocomplete": "email", "autocapitalize": "none", **attrs}),
    )


def _password_field(label, autocomplete, help_text=""):
    return forms.CharField(
        label=label,
        strip=False,
        help_text=help_text,
        widget=forms.PasswordInput(attrs={"autocomplete": autocomplete}),
    )


class SignupForm(forms.Form):
    email = _email_field(autofocus=True)
    password = _password_field(
        "Password", "new-password", "At least 10 characters; not a common password, not only digits."
    )
    password_confirm = _password_field("Password again", "new-password")

    def clean(self):
        cleaned = super().clean()
        password, confirm = cleaned.get("password"), cleaned.get("password_confirm")
        if password and confirm and password != confirm:
            self.add_error("password_confirm", "The two passwords differ. Type the same password twice.")
        return cleaned


class LoginForm(AuthenticationForm):
    """Django's login form with the email as the username ("username" is what django-axes reads)."""

    username = _email_field(autofocus=True)
    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "That email address and password do not match an account. Check both and try again.",
        "inactive": "This account is disabled.",
    }

    def clean_username(self):
        # Addresses are stored lower-case; the lockout normalises the same way (AXES_USERNAME_CALLABLE).
        return normalise_login_name(self.cleaned_data["username"])

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        # An address nobody has proven yet logs in through its emailed link (with the password) only.
        # Refused exactly like a wrong password: anyone can sign up an address with a password of their
        # own, and a login that worked would tell them the address had no account before.
        if not user.email_verified and user.has_usable_password():
            raise self.get_invalid_login_error()


class LinkPasswordForm(forms.Form):
    """The password of the account an emailed confirmation link is for, typed on the link's page."""

    password = _password_field("Password", "current-password")


class PasswordResetRequestForm(forms.Form):
    email = _email_field(autofocus=True)


class EmailChangeForm(forms.Form):
    new_email = _email_field("New email address")
    password = _password_field("Current password", "current-password")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        # An account made with GitHub has no password to confirm with.
        if not user.has_usable_password():
            del self.fields["password"]


class SshKeyForm(forms.Form):
    name = forms.CharField(
        max_length=100, required=False, widget=forms.TextInput(attrs={"placeholder": "laptop"})
    )
    public_key = forms.CharField(
        label="Public key",
        required=False,
        strip=True,
        help_text="The contents of ~/.ssh/id_ed25519.pub (Ed25519, ECDSA, or RSA with at least 2048 bits).",
        widget=forms.Textarea(
            attrs={"rows": 4, "placeholder": "ssh-ed25519 AAAAC3Nza… you@laptop", "spellcheck": "false"}
        ),
    )

    def __init__(self, *args, **kwargs):
        # Ids of its own: the Settings page shows it beside the token form, which also has a "name".
        kwargs.setdefault("auto_id", "id_key_%s")
        super().__init__(*args, **kwargs)


class AccountDeleteForm(forms.Form):
    confirm_email = forms.CharField(
        label="Type your email address to confirm",
        widget=forms.TextInput(attrs={"autocomplete": "off", "autocapitalize": "none"}),
    )
    password = _password_field("Current password", "current-password")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        if not user.has_usable_password():
            del self.fields["password"]

    def clean_confirm_email(self):
        typed = self.cleaned_data["confirm_email"].strip().lower()
        if typed != self.user.email:
            raise forms.ValidationError(f"Type {self.user.email} exactly to confirm.")
        return typed

    def clean_password(self):
        password = self.cleaned_data["password"]
        if not self.user.check_password(password):
            raise forms.ValidationError("That is not your current password.")
        return password
