from django.conf import settings
from django.db import models
from django.db.models import Q


class ApiToken(models.Model):
    """A personal access token. Only a SHA-256 digest of its secret is stored; the whole token is shown
    once, when it is created.

    The token reads `dcp_<prefix>_<secret>`: `prefix` finds the row (it is not secret), and the secret's
    digest is compared in constant time (see portal.api.services.token_authenticate).
    """

    class Scope(models.TextChoices):
        READ = "read", "Read"
        LAUNCH = "launch", "Read and launch"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.READ)
    prefix = models.CharField(max_length=16, unique=True)
    secret_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    # Updated at most once a minute (see services.token_authenticate), so reads do not each write a row.
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Which session made the token (portal.accounts.services.origin_of_session), so a password change can
    # revoke the tokens a stolen session made; "" for tokens older than this field.
    added_from = models.CharField(max_length=64, blank=True, default="")
    # A robot token: it belongs to this project (its user is the project's bot account), launches only
    # for it, and owners manage it (portal/api/robots.py). Null for a person's own token.
    project = models.ForeignKey(
        "projects.Project", null=True, blank=True, on_delete=models.CASCADE, related_name="robot_tokens"
    )
    # A robot token's own limit on the project's instances it has live at once; 0: the project's only.
    max_live_instances = models.PositiveIntegerField(default=0)
    # For a token a CI run's OpenID Connect token was exchanged for: "<issuer> <jti>", so that one CI
    # token is exchanged once.
    oidc_jti = models.CharField(max_length=400, null=True, blank=True, unique=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(scope__in=["read", "launch"]), name="api_token_known_scope"),
        ]

    def __str__(self):
        return f"{self.name} (dcp_{self.prefix}_…)"

    @property
    def can_launch(self) -> bool:
        return self.scope == self.Scope.LAUNCH


class IdempotentLaunch(models.Model):
    """A launch made through the API with an Idempotency-Key header, so a retried request launches once.

    The row is inserted in the same transaction as the instance: a concurrent retry waits on the unique
    key, then finds the instance. `request_sha256` refuses the same key with a different body.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=200)
    request_sha256 = models.CharField(max_length=64)
    # Set in the transaction that inserts the row, so a committed row always has it.
    instance = models.ForeignKey("instances.Instance", null=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="api_idempotency_key_per_user")]

    def __str__(self):
        return f"{self.key} -> {self.instance_id}"


class TokenLaunch(models.Model):
    """Which token launched which instance, for a project's usage by token and a robot token's own
    live-instance limit."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="launches")
    instance = models.OneToOneField("instances.Instance", on_delete=models.CASCADE, related_name="+")
