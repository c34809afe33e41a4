"""Account pages: sign-up, log-in, email confirmation, password reset, settings, SSH keys, deletion.

Views are short: check who is asking, call one service, answer. Rules live in services.py.
"""

import ipaddress
from functools import wraps

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login, logout
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import SetPasswordForm
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse_lazy
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.encoding import force_str
from django.utils.http import url_has_allowed_host_and_scheme, urlsafe_base64_decode
from django.views.decorators.http import require_POST
from django_ratelimit.core import get_usage

from portal.api import selectors as api_selectors
from portal.api import services as api_services
from portal.api.forms import ApiTokenForm
from portal.api.models import ApiToken
from portal.sshgateway.selectors import connection_help

from . import selectors, services
from .forms import (
    AccountDeleteForm,
    EmailChangeForm,
    LinkPasswordForm,
    LoginForm,
    PasswordResetRequestForm,
    SignupForm,
    SshKeyForm,
)
from .login_names import normalise_login_name
from .models import SshKey
from .services import LinkError
from .tokens import password_reset_tokens

MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


# --- Client address and rate limits ------------------------------------------------------------


def client_ip(request) -> str:
    """The address of the browser, as far as the trusted reverse proxies let us know it.

    With TRUSTED_PROXY_COUNT = 0 that is REMOTE_ADDR and X-Forwarded-For is ignored (anyone can
    send it). Behind N proxies, each appends the address it got the request from, so the client is
    the N-th entry from the right; entries further left are whatever the client claimed. Something
    that is not an IP address falls back to REMOTE_ADDR. Used by django-ratelimit and django-axes.
    """
    remote_addr = request.META.get("REMOTE_ADDR", "")
    count = settings.TRUSTED_PROXY_COUNT
    if count <= 0:
        return remote_addr
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    if not hops:
        return remote_addr
    candidate = hops[-count] if len(hops) >= count else hops[0]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return remote_addr


def _ip_key(group, request) -> str:
    return client_ip(request)


def _user_key(group, request) -> str:
    return str(request.user.pk)


def _posted_address_key(field):
    """A key on the address posted in `field`, spelt as the lookup matches it (any case, any spacing)."""
    return lambda group, request: normalise_login_name(request.POST.get(field))


def _rate_limit(
    setting_name: str, *, per_user: bool = False, per_address_field: str | None = None, per_ip: bool = True
):
    """Limit POSTs to the view per client IP (and per account, or per posted address) to the rate in
    `setting_name`.

    The rate is read at request time, so tests and operators can change it. A refused request gets
    the 429 page; the counters live in the "ratelimit" database cache, which keeps working while
    Redis is down.
    """
    keys = ([("ip", _ip_key)] if per_ip else []) + ([("user", _user_key)] if per_user else [])
    if per_address_field:
        keys.append(("address", _posted_address_key(per_address_field)))

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            for key_name, key in keys:
                usage = get_usage(
                    request,
                    group=f"accounts.{view.__name__}.{key_name}",
                    key=key,
                    rate=lambda group, request: getattr(settings, setting_name),
                    method="POST",
                    increment=True,
                )
                if usage and usage["should_limit"]:
                    return rate_limited(request, None, retry_after=usage["time_left"])
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


def _wait_text(seconds: int) -> str:
    minutes = max(1, -(-seconds // 60))
    if minutes < 90:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    hours = -(-minutes // 60)
    return f"{hours} hours"


def rate_limited(request, exception=None, retry_after: int | None = None):
    """The 429 page for too many sign-ups or emails from one network (also RATELIMIT_VIEW)."""
    context = {"wait": _wait_text(retry_after) if retry_after and retry_after > 0 else None}
    response = render(request, "accounts/rate_limited.html", context, status=429)
    if retry_after and retry_after > 0:
        response["Retry-After"] = str(retry_after)
    return response


def _posted(request):
    # Not `request.POST or None`: an empty POST must still be validated (and refused), not ignored.
    return request.POST if request.method == "POST" else None


def _back(request, default="credits:dashboard"):
    """Where the user came from, when that is a page of this site."""
    target = request.POST.get("next") or request.META.get("HTTP_REFERER", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(target)
    return redirect(default)


# --- Sign-up and log-in ------------------------------------------------------------------------


# Per address too (the same for a new address and a taken one): sign-ups cannot flood one person's inbox.
@_rate_limit("SIGNUP_RATE")
@_rate_limit("EMAIL_SEND_RATE", per_address_field="email", per_ip=False)
def signup(request):
    """The answer is the same whether or not the address has an account (services.account_signup): a
    page that says to read the email, and no session; the new account logs in once it follows its link."""
    if request.user.is_authenticated:
        return redirect("credits:dashboard")
    form = SignupForm(_posted(request))
    if request.method == "POST" and form.is_valid():
        try:
            services.account_signup(email=form.cleaned_data["email"], password=form.cleaned_data["password"])
        except ValidationError as error:
            form.add_error(None, error)
        else:
            email = form.cleaned_data["email"].strip().lower()
            return render(request, "accounts/signup_done.html", {"email": email})
    return render(request, "accounts/signup.html", {"form": form})


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    authentication_form = LoginForm
    redirect_authenticated_user = True


login_view = LoginView.as_view()
# POST only (Django 5): a link or an image cannot log anyone out.
logout_view = auth_views.LogoutView.as_view()


# --- Email confirmation links ------------------------------------------------------------------


def _user_from_uid(uidb64):
    try:
        pk = force_str(urlsafe_base64_decode(uidb64))
    except (TypeError, ValueError, OverflowError):
        return None
    return selectors.active_user_by_pk(pk) if pk.isdigit() else None


def _link_failed(request, reason, *, kind):
    status = 200 if reason == LinkError.ALREADY_CONFIRMED else 400
    return render(request, "accounts/link_invalid.html", {"reason": reason, "kind": kind}, status=status)


def _owner_is_here(request, user) -> bool:
    return request.user.is_authenticated and request.user.pk == user.pk


def _confirm_page(request, user, *, kind, password_form=None):
    """The page an emailed link opens: one button, which confirms only for the account's own browser.

    Anyone else (a mail scanner, a browser logged out or logged in as someone else) gets the page too and
    the button leads to logging in (or out) first; a POST from them changes nothing (403).
    """
    status = 403 if request.method == "POST" else 200
    context = {
        "kind": kind,
        "account": user,
        "owner_here": _owner_is_here(request, user),
        "password_form": password_form,
    }
    return render(request, "accounts/link_confirm.html", context, status=status)


def _removed_message(request, removed):
    if removed:
        messages.warning(
            request,
            f"For your safety {removed.summary()}: they were set up before this address was proven to be "
            "yours. If GitHub was yours, connect it again from Settings.",
        )


def _after_confirmation(request, proof):
    if proof.grant is not None:
        messages.success(request, f"{proof.grant.hours} GPU-hours were added to your balance.")
    _removed_message(request, proof.removed)
    # A new session key: nothing learnt about the session before the proof is of use after it.
    request.session.cycle_key()
    return redirect("credits:dashboard")


def verify(request, uidb64, token):
    """Follow the link from the sign-up email. GET changes nothing (mail scanners fetch links): it shows
    a page whose button POSTs back here. Only the person who set the password confirms: a browser logged
    in as the account, or one that types the account's password on the page (and is then logged in; an
    unconfirmed account cannot log in otherwise). Someone else who reads the mail resets the password."""
    user = _user_from_uid(uidb64)
    if user is None:
        return _link_failed(request, LinkError.INVALID, kind="verify")
    password_form = None
    try:
        services.email_verify_check(user=user, token=token)
        owner_here = _owner_is_here(request, user)
        if not owner_here and not request.user.is_authenticated and user.has_usable_password():
            password_form = LinkPasswordForm(_posted(request))
            if request.method == "POST" and password_form.is_valid():
                if user.check_password(password_form.cleaned_data["password"]):
                    owner_here = True
                else:
                    password_form.add_error("password", "That is not the password of this account.")
        if request.method != "POST" or not owner_here:
            return _confirm_page(request, user, kind="verify", password_form=password_form)
        proof = services.email_verify(user=user, token=token, keep_session_key=request.session.session_key)
    except LinkError as error:
        return _link_failed(request, error.reason, kind="verify")
    if not _owner_is_here(request, user):
        login(request, user, backend=MODEL_BACKEND)
    messages.success(request, f"Thank you: {user.email} is confirmed.")
    return _after_confirmation(request, proof)


def email_confirm(request, uidb64, token):
    """Follow the link sent to a new address: the account moves to it, on the button's POST only, from a
    browser logged in as the account (see verify)."""
    user = _user_from_uid(uidb64)
    if user is None:
        return _link_failed(request, LinkError.INVALID, kind="email_change")
    try:
        services.email_change_check(user=user, token=token)
        if request.method != "POST" or not _owner_is_here(request, user):
            return _confirm_page(request, user, kind="email_change")
        proof = services.email_change_confirm(
            user=user, token=token, keep_session_key=request.session.session_key
        )
    except LinkError as error:
        return _link_failed(request, error.reason, kind="email_change")
    user.refresh_from_db(fields=["email"])
    messages.success(request, f"Your email address is now {user.email}.")
    return _after_confirmation(request, proof)


@require_POST
@login_required
@_rate_limit("EMAIL_SEND_RATE", per_user=True)
def resend(request):
    addresses = services.email_verification_resend(user=request.user)
    if addresses:
        messages.success(
            request, f"We sent a new link to {' and '.join(addresses)}. Earlier links still work."
        )
    else:
        messages.info(request, "Your email address is already confirmed.")
    return _back(request)


# --- Password reset (Django's views, our templates, email through the Celery task) -------------


# Per address as well as per network: requests from many networks cannot flood one person's inbox.
@_rate_limit("EMAIL_SEND_RATE", per_address_field="email")
def password_reset(request):
    form = PasswordResetRequestForm(_posted(request), initial={"email": request.GET.get("email", "")})
    if request.method == "POST" and form.is_valid():
        services.password_reset_request(email=form.cleaned_data["email"])
        return redirect("accounts:password_reset_done")
    return render(request, "accounts/password_reset.html", {"form": form})


password_reset_done = auth_views.PasswordResetDoneView.as_view(
    template_name="accounts/password_reset_done.html"
)


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    template_name = "accounts/password_reset_confirm.html"
    success_url = reverse_lazy("accounts:password_reset_complete")

    # Ours, not Django's default: a squatter logging in must not kill the owner's link (see tokens.py).
    token_generator = password_reset_tokens

    def form_valid(self, form):
        response = super().form_valid(form)
        proof = services.password_reset_completed(
            user=form.user, keep_session_key=self.request.session.session_key
        )
        if _owner_is_here(self.request, form.user):
            # Logged in with the old password: log in again with the new one, like every other browser.
            logout(self.request)
        if proof.grant is not None:
            messages.success(
                self.request,
                f"{form.user.email} is confirmed too: "
                f"{proof.grant.hours} GPU-hours were added to your balance.",
            )
        _removed_message(self.request, proof.removed)
        return response


password_reset_confirm = PasswordResetConfirmView.as_view()
password_reset_complete = auth_views.PasswordResetCompleteView.as_view(
    template_name="accounts/password_reset_complete.html"
)


# --- Settings ----------------------------------------------------------------------------------


def _settings_page(request, *, key_form=None, token_form=None, new_token="", status=200):
    context = {
        "github": selectors.github_account_for(request.user),
        "ssh_keys": selectors.ssh_keys_for(request.user),
        "ssh": connection_help(request.user),
        "key_form": key_form or SshKeyForm(),
        "api_tokens": api_selectors.tokens_of(request.user),
        "token_form": token_form or ApiTokenForm(),
        # The whole token, shown in this one response only: the database keeps just its digest.
        "new_token": new_token,
        "now": timezone.now(),
    }
    return render(request, "accounts/settings.html", context, status=status)


@login_required
def settings_view(request):
    return _settings_page(request)


@login_required
@_rate_limit("EMAIL_SEND_RATE", per_user=True)
def email_change(request):
    form = EmailChangeForm(_posted(request), user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            services.email_change_request(
                user=request.user,
                new_email=form.cleaned_data["new_email"],
                password=form.cleaned_data.get("password", ""),
            )
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(
                request,
                f"We sent a link to {request.user.pending_email}. Your address changes when you follow it.",
            )
            return redirect("accounts:settings")
    return render(request, "accounts/email_change.html", {"form": form})


@require_POST
@login_required
def email_change_cancel(request):
    services.email_change_cancel(user=request.user)
    messages.info(request, "The email change was cancelled; its link no longer works.")
    return redirect("accounts:settings")


class PasswordChangeView(auth_views.PasswordChangeView):
    """Change the password and stay logged in. An account made with GitHub sets its first one."""

    template_name = "accounts/password_change.html"
    success_url = reverse_lazy("accounts:settings")

    def get_form_class(self):
        return super().get_form_class() if self.request.user.has_usable_password() else SetPasswordForm

    def form_valid(self, form):
        response = super().form_valid(form)
        # After super(): it re-signed this session (new key), which is the one to keep.
        removed = services.password_changed(
            user=self.request.user,
            session=self.request.session,
            keep_session_key=self.request.session.session_key,
        )
        messages.success(self.request, "Your password was changed. Links emailed before now no longer work.")
        if removed:
            messages.warning(
                self.request,
                f"For your safety {removed.summary()}: they were added from another browser or token since "
                "the previous password change. Add again any that were yours.",
            )
        return response


password_change = PasswordChangeView.as_view()


@require_POST
@login_required
def sshkey_add(request):
    form = SshKeyForm(request.POST)
    if form.is_valid():
        try:
            key = services.sshkey_add(
                user=request.user,
                name=form.cleaned_data["name"],
                public_key=form.cleaned_data["public_key"],
                added_from=services.origin_of_session(request.session),
            )
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, f"Added the key “{key.name}”.")
            return redirect("accounts:settings")
    return _settings_page(request, key_form=form, status=400)


@require_POST
@login_required
def sshkey_delete(request, key_id):
    # Filtering by owner makes someone else's key a 404, the same as a key that does not exist.
    key = get_object_or_404(SshKey, pk=key_id, user=request.user)
    services.sshkey_delete(key=key)
    messages.success(request, f"Removed the key “{key.name}”.")
    return redirect("accounts:settings")


@require_POST
@login_required
def api_token_create(request):
    form = ApiTokenForm(request.POST)
    if form.is_valid():
        try:
            token, text = api_services.token_create(
                user=request.user, added_from=services.origin_of_session(request.session), **form.cleaned_data
            )
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, f"Created the token “{token.name}”. Copy it now: it is not shown again.")
            response = _settings_page(request, new_token=text)
            # The page carries a secret: no cache may keep it.
            add_never_cache_headers(response)
            return response
    return _settings_page(request, token_form=form, status=400)


@require_POST
@login_required
def api_token_revoke(request, token_id):
    try:
        token = api_services.token_revoke(user=request.user, token_id=token_id)
    except ApiToken.DoesNotExist:
        raise Http404("No such token.") from None
    messages.success(request, f"Revoked the token “{token.name}”. It no longer works.")
    return redirect("accounts:settings")


@login_required
def account_delete(request):
    form = AccountDeleteForm(_posted(request), user=request.user)
    if request.method == "POST" and form.is_valid():
        services.account_delete(user=request.user)
        logout(request)
        messages.info(request, "Your account was deleted. Your email address and keys are gone.")
        return redirect("accounts:login")
    return render(request, "accounts/account_delete.html", {"form": form})
