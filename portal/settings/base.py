"""Settings shared by every environment. Every value comes from the environment; README.md has the table."""

import importlib.util
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()

# --- Core -------------------------------------------------------------------------------------
SECRET_KEY = env("SECRET_KEY", default="insecure-dev-key-change-me")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# Public base URL used in emails (verification and reset links).
SITE_URL = env("SITE_URL", default="http://127.0.0.1:8000").rstrip("/")
SITE_NAME = env("SITE_NAME", default="DevCloud")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "axes",
    "social_django",
    "portal.audit",
    "portal.accounts",
    "portal.credits",
    "portal.instances",
    "portal.projects",
    "portal.console",
    "portal.notifications",
    "provisioning",
    "portal.sshgateway",
    "portal.ports",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "portal.api",
]

MIDDLEWARE = [
    # /healthz, /readyz and /metrics: answered before the host check and the HTTPS redirect (see there).
    "portal.console.probes.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "portal.accounts.middleware.SocialAuthErrorMiddleware",
    # Axes must be last: it turns lockouts raised by the auth backend into a clear response. This is
    # axes' own middleware, run synchronously only (portal/accounts/middleware.py says why).
    "portal.accounts.middleware.AxesMiddleware",
]
# axes.W002 looks for axes' middleware by its dotted path and misses the subclass above.
SILENCED_SYSTEM_CHECKS = ["axes.W002"]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.accounts.context_processors.site",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------------
# DATABASE_URL, e.g. postgres://devcloud@127.0.0.1:5432/devcloud. The embedded default is SQLite.
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'devcloud.sqlite3'}")}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=0))
# On PostgreSQL each process keeps a pool of open connections (psycopg_pool through Django's "pool"
# option): opening one costs the database a process and several milliseconds per request, and the
# threads of a process (web threads, the gateway's access threads, the provisioning worker's) share them.
# Setting DATABASE_CONN_MAX_AGE turns the pool off (Django allows one or the other), and so does an
# environment without the psycopg-pool package. The pool never caps below what the database allows
# (PostgreSQL's default max_connections): the provisioning worker's threads each hold a connection
# while a launch runs, and a smaller pool would fail a burst of launches waiting for one. Connections
# idle for a minute are closed, so a burst's connections do not stay open.
_database = DATABASES["default"]
if (
    _database["ENGINE"] == "django.db.backends.postgresql"
    and not _database["CONN_MAX_AGE"]
    and importlib.util.find_spec("psycopg_pool") is not None
):
    _database.setdefault("OPTIONS", {}).setdefault(
        "pool", {"min_size": 1, "max_size": 100, "max_idle": 60, "timeout": 30}
    )
# SQLite (make run's embedded default) serves the web process, both workers and beat at once. With its
# default deferred transactions, two that read and then write find each other holding the lock and one
# fails at once with "database is locked" (a Stop click racing the meter tick did). IMMEDIATE takes the
# write lock when a transaction begins, so the others wait for it (up to `timeout` seconds) instead, and
# WAL lets pages read while a worker writes.
if _database["ENGINE"] == "django.db.backends.sqlite3":
    _database.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Rate-limit counters live in the database, so pages and sign-up keep working while Redis is down.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "ratelimit": {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "devcloud_ratelimit_cache",
    },
    # Spent JupyterLab tickets (each opens a lab once), shared by every web process; see docs/gateway.md.
    "gateway": {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "devcloud_gateway_cache",
        # Past this many rows the expired ones are deleted. An entry lives 150 seconds, so only more than
        # 10,000 lab openings in that time would cull live ones (a ticket spent twice, by its browser).
        "OPTIONS": {"MAX_ENTRIES": 10_000},
    },
}
RATELIMIT_USE_CACHE = "ratelimit"
RATELIMIT_VIEW = "portal.accounts.views.rate_limited"

# --- Auth -------------------------------------------------------------------------------------
AUTH_USER_MODEL = "accounts.User"
AUTHENTICATION_BACKENDS = [
    # Axes first, so a locked-out client is refused before a password is checked.
    "axes.backends.AxesStandaloneBackend",
    "portal.accounts.github.GithubOAuth2",
    "django.contrib.auth.backends.ModelBackend",
]
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "credits:dashboard"
LOGOUT_REDIRECT_URL = "accounts:login"
# Verification and password-reset links stop working after this many seconds (default 3 days).
PASSWORD_RESET_TIMEOUT = env.int("TOKEN_TIMEOUT_SECONDS", default=3 * 24 * 3600)

# django-axes: lock out after AXES_FAILURE_LIMIT failed logins, per client IP and per account.
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("LOGIN_COOLOFF_HOURS", default=0.25)
AXES_LOCKOUT_PARAMETERS = ["ip_address", "username"]
AXES_USERNAME_FORM_FIELD = "username"
# The lockout counts "Olivia@X " and "olivia@x" as one account on every login path (portal, /admin/, any
# later API login), as the user lookup does; see portal/accounts/login_names.py.
AXES_USERNAME_CALLABLE = "portal.accounts.login_names.axes_username"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "accounts/locked_out.html"
# Number of reverse proxies in front of the portal; the real client IP is read from X-Forwarded-For
# behind that many hops, and REMOTE_ADDR is used when it is 0.
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)
# One definition of "the client's address" for lockouts and rate limits (ipware's proxy count is off by
# one for a single proxy, and would trust a forged X-Forwarded-For entry).
AXES_CLIENT_IP_CALLABLE = "portal.accounts.views.client_ip"
# Sign-ups, resends and reset requests allowed per client IP (django-ratelimit syntax). Resends and
# reset requests are also limited per account or target address, so many networks cannot flood one inbox.
SIGNUP_RATE = env("SIGNUP_RATE", default="10/h")
EMAIL_SEND_RATE = env("EMAIL_SEND_RATE", default="5/h")

# --- GitHub OAuth (social-auth-app-django) ----------------------------------------------------
SOCIAL_AUTH_GITHUB_KEY = env("GITHUB_CLIENT_ID", default="")
SOCIAL_AUTH_GITHUB_SECRET = env("GITHUB_CLIENT_SECRET", default="")
SOCIAL_AUTH_GITHUB_SCOPE = ["user:email"]
# Where GitHub lives; tests point these at a local stand-in.
GITHUB_OAUTH_URL = env("GITHUB_OAUTH_URL", default="https://github.com").rstrip("/")
GITHUB_API_URL = env("GITHUB_API_URL", default="https://api.github.com").rstrip("/")

# --- Keyless CI sign-in (portal/lib/oidc.py) -----------------------------------------------------
# OpenID Connect issuers are fetched only over https; this also admits http issuers on a loopback
# address (127.0.0.1, ::1, localhost), for the tests' local issuer. Never on in production.
OIDC_ALLOW_INSECURE_LOOPBACK_ISSUERS = env.bool("OIDC_ALLOW_INSECURE_LOOPBACK_ISSUERS", default=False)
# Keyless CI sign-in (portal/api/robots.py): the CI providers whose OpenID Connect tokens projects may
# trust, as name=issuer URL pairs separated by commas. Only these URLs are ever fetched; a project's
# owners pick a name, never type a URL.
OIDC_PROVIDERS = dict(
    pair.split("=", 1)
    for pair in env(
        "OIDC_PROVIDERS", default="github=https://token.actions.githubusercontent.com"
    ).split(",")
    if "=" in pair
)
# The audience a CI token must be issued for; `devcloud` asks the CI provider for it (GET /api/v1/oidc).
OIDC_AUDIENCE = env("OIDC_AUDIENCE", default=SITE_URL)
# How long the DevCloud token a CI sign-in gives lives: long enough for a job to stop what it launched
# (GitHub Actions ends a job after 6 hours).
OIDC_TOKEN_MINUTES = env.int("OIDC_TOKEN_MINUTES", default=360)
SOCIAL_AUTH_URL_NAMESPACE = "social"
SOCIAL_AUTH_JSONFIELD_ENABLED = True
SOCIAL_AUTH_LOGIN_REDIRECT_URL = "/"
SOCIAL_AUTH_LOGIN_ERROR_URL = "/accounts/login/"
SOCIAL_AUTH_REDIRECT_IS_HTTPS = env.bool("SECURE_SSL_REDIRECT", default=False)
SOCIAL_AUTH_PIPELINE = [
    "social_core.pipeline.social_auth.social_details",
    "social_core.pipeline.social_auth.social_uid",
    "social_core.pipeline.social_auth.auth_allowed",
    "social_core.pipeline.social_auth.social_user",
    "portal.accounts.github.require_verified_email",
    "portal.accounts.github.associate_verified_email",
    "portal.accounts.github.create_user",
    "social_core.pipeline.social_auth.associate_user",
    "social_core.pipeline.social_auth.load_extra_data",
    "portal.accounts.github.after_login",
]

# --- Email ------------------------------------------------------------------------------------
EMAIL_HOST = env("EMAIL_HOST", default="")
EMAIL_PORT = env.int("EMAIL_PORT", default=587)
EMAIL_HOST_USER = env("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=20)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="DevCloud <noreply@devcloud.localhost>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL
# SMTP when EMAIL_HOST is set, otherwise the console (the email is printed by the worker).
EMAIL_BACKEND = env(
    "EMAIL_BACKEND",
    default="django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend",
)

# --- Celery -----------------------------------------------------------------------------------
REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 15 * 60
CELERY_TASK_SOFT_TIME_LIMIT = 14 * 60
CELERY_TASK_DEFAULT_QUEUE = env("CELERY_QUEUE", default="devcloud")
# Launches go to this queue, served by a worker made for waiting on engines and JupyterLab, so a burst of
# them never delays metering, stops or emails (portal/workers.py has the layout). Empty = the default queue.
CELERY_PROVISIONING_QUEUE = env("CELERY_PROVISIONING_QUEUE", default="provisioning")
CELERY_TASK_ROUTES = ("portal.workers.route_task",)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A publish while Redis is down fails fast instead of hanging a web request.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, "max_retries": 1, "socket_connect_timeout": 2}

# --- Credits (see docs/architecture.md, "Credits") -------------------------------------------
# Cap on bonus GPU-hours one person can collect across every bonus program.
BONUS_CAP_GPU_HOURS = env.int("BONUS_CAP_GPU_HOURS", default=50)
# The open-source CI programme (docs/architecture.md, "The open-source CI programme"): the monthly
# GPU-hours an operator's approval offers unless they type another amount, and the day of the month
# (UTC, 1-28 so every month has it) on which every grant renews and the previous period's leftover expires.
CI_GRANT_DEFAULT_HOURS = env.int("CI_GRANT_DEFAULT_HOURS", default=100)
CI_GRANT_RENEWAL_DAY = env.int("CI_GRANT_RENEWAL_DAY", default=1)
if not 1 <= CI_GRANT_RENEWAL_DAY <= 28:
    raise ImproperlyConfigured("CI_GRANT_RENEWAL_DAY must be a day every month has: 1 to 28.")
# Bonus applications one person may file in 24 hours (all programs), and one program takes per hour
# from everyone: each application is one guess at a certificate ID, so guessing stays slow however
# many accounts someone opens. Counted from the applications, rejected ones included.
BONUS_APPLICATIONS_PER_PERSON_PER_DAY = env.int("BONUS_APPLICATIONS_PER_PERSON_PER_DAY", default=5)
BONUS_APPLICATIONS_PER_PROGRAM_PER_HOUR = env.int("BONUS_APPLICATIONS_PER_PROGRAM_PER_HOUR", default=200)
# Seeded early-registrant grant: hours, how many accounts get it, and when it closes (ISO date, empty = open).
SIGNUP_GRANT_GPU_HOURS = env.int("SIGNUP_GRANT_GPU_HOURS", default=25)
SIGNUP_GRANT_MAX_ACCOUNTS = env.int("SIGNUP_GRANT_MAX_ACCOUNTS", default=10000)
SIGNUP_GRANT_OPEN_UNTIL = env("SIGNUP_GRANT_OPEN_UNTIL", default="")

# --- Instances (see docs/architecture.md, "Instances") ----------------------------------------
# "docker" runs instances as containers on each host's Docker engine; "local" runs JupyterLab as a
# subprocess with no GPU isolation (for `make run` on a machine without Docker).
DEVCLOUD_DRIVER = env("DEVCLOUD_DRIVER", default="docker")
# A registry's host[:port] (e.g. "registry.internal:5000") that serves the catalogue's images: when set,
# `manage.py sync_images` stores every image as <registry>/devcloud/<key>:<hash>, so a host that lacks an
# image pulls it from there (a newly added host gets them all that way). Empty: images are built or loaded
# on each engine under their bare names, as `make run` does. See docs/architecture.md, "Images on hosts".
IMAGE_REGISTRY = env("IMAGE_REGISTRY", default="")
# The image of the short-lived helper container that reads a host's GPUs and device gids through its engine
# (provisioning/hostfs.py); empty: the catalogue's cpu image (under IMAGE_REGISTRY when that is set).
DEVCLOUD_HOST_HELPER_IMAGE = env("DEVCLOUD_HOST_HELPER_IMAGE", default="")
# Labels every container and volume with this id, so portals sharing a Docker engine never touch each
# other's. Empty: the install's own random id, made on first migrate and kept in the database
# (provisioning/identity.py); set it only to choose the id yourself.
DEVCLOUD_PORTAL_ID = env("DEVCLOUD_PORTAL_ID", default="")
# The Fernet keys, comma-separated, that seal secrets kept in the database (hosts' TLS client keys, a
# Slurm cluster's JWT; portal/lib/sealed.py): the first seals, all open (`manage.py rotate_sealing_key`).
# Empty: a key derived from SECRET_KEY, so changing SECRET_KEY then makes sealed values unreadable.
DEVCLOUD_SEALING_KEY = env("DEVCLOUD_SEALING_KEY", default="")
# How often an instance's Slurm job reports from its node that it still runs (with its GPUs' use): an
# instance whose node dies is charged up to its last report.
SLURM_JOB_HEARTBEAT_SECONDS = env.int("SLURM_JOB_HEARTBEAT_SECONDS", default=30)
# Seconds one Docker Engine API call may take before the host counts as unreachable.
DEVCLOUD_DOCKER_TIMEOUT = env.int("DEVCLOUD_DOCKER_TIMEOUT", default=30)
# Process limit of a container, per GPU it holds.
DEVCLOUD_PIDS_PER_GPU = env.int("DEVCLOUD_PIDS_PER_GPU", default=4096)
# What discovery holds back of each host for itself (its engine, the kernel, page cache) before giving each
# GPU an even share of the rest (provisioning/shares.py): CPUs, and a percentage of memory with a floor in
# MiB. Never more than half the host. An operator's per-host override wins.
DEVCLOUD_HOST_RESERVED_CPUS = env.int("DEVCLOUD_HOST_RESERVED_CPUS", default=4)
DEVCLOUD_HOST_RESERVED_MEMORY_PERCENT = env.int("DEVCLOUD_HOST_RESERVED_MEMORY_PERCENT", default=5)
DEVCLOUD_HOST_RESERVED_MEMORY_MIN_MB = env.int("DEVCLOUD_HOST_RESERVED_MEMORY_MIN_MB", default=8192)
# --- Disk limits (docs/architecture.md, "Disk limits") -------------------------------------------
# Per size ("1x=100,8x=500"): GB a person's /workspace volume may hold, set when the volume is made (a
# full one gives ENOSPC inside), and GB an instance may write outside /workspace (its container's
# writable layer). 0 or a size left out: no limit. The host's engine enforces them (an XFS data root
# mounted with pquota); DEVCLOUD_DISK_LIMITS says what happens on an engine that cannot.
def _gb_per_size(text: str) -> dict[str, int]:
    return {key.strip(): int(value) for key, _, value in (item.partition("=") for item in text.split(",") if item)}


DEVCLOUD_WORKSPACE_GB = _gb_per_size(env("DEVCLOUD_WORKSPACE_GB", default="1x=100,8x=500"))
DEVCLOUD_CONTAINER_DISK_GB = _gb_per_size(env("DEVCLOUD_CONTAINER_DISK_GB", default="1x=50,8x=200"))
# "enforce": a launch on a host whose engine cannot enforce the limits fails, saying why (one user could
# fill that host's disk). "warn": it starts without them, and the instance's page and the worker's log say so
# (`make run` on an ext4 machine).
DEVCLOUD_DISK_LIMITS = env("DEVCLOUD_DISK_LIMITS", default="enforce")
# Where the local driver keeps workspaces and run directories.
DEVCLOUD_LOCAL_ROOT = env("DEVCLOUD_LOCAL_ROOT", default=str(BASE_DIR / "var"))
# Lab origin for subdomain mode, e.g. "https://{instance_id}.lab.example.com"; empty = path mode
# (/instances/<uuid>/lab/ on the portal's own host). See docs/gateway.md.
GATEWAY_LAB_URL = env("GATEWAY_LAB_URL", default="")
# Shared secret nginx sends as X-DevCloud-Gateway-Secret to /instances/<uuid>/auth; empty = off.
GATEWAY_AUTH_SECRET = env("GATEWAY_AUTH_SECRET", default="")
# The lab host's sign-in cookie (subdomain mode); production gives it the `__Host-` prefix.
GATEWAY_LAB_COOKIE_NAME = "devcloud_lab"
# A launch needs at least this many minutes of credit at its size, after what the user's other live
# instances will burn in the same window.
LAUNCH_MIN_CREDIT_MINUTES = env.int("LAUNCH_MIN_CREDIT_MINUTES", default=15)
# The limits beat warns an instance's owner this many minutes before its session's longest length stops
# it (again after each extension); 0 turns the warning off.
SESSION_END_WARNING_MINUTES = env.int("SESSION_END_WARNING_MINUTES", default=30)
# The most extra hours an owner may add to one session (services.instance_extend); 0: no extending.
SESSION_MAX_EXTENSION_HOURS = env.int("SESSION_MAX_EXTENSION_HOURS", default=8)
# Reservations (portal/instances/reservations.py): how far ahead a window may start, in days; the longest
# window, in hours; and the window-hours one person may book per week (Monday to Monday, UTC, counted by
# each window's start; cancelled bookings do not count).
RESERVATION_MAX_AHEAD_DAYS = env.int("RESERVATION_MAX_AHEAD_DAYS", default=14)
RESERVATION_MAX_HOURS = env.int("RESERVATION_MAX_HOURS", default=24)
RESERVATION_WEEKLY_HOURS_PER_USER = env.int("RESERVATION_WEEKLY_HOURS_PER_USER", default=48)
# The share of a booking's unused GPU-seconds charged when its window ends, 0 to 100 (0: unused time is free).
RESERVATION_UNUSED_CHARGE_PERCENT = env.int("RESERVATION_UNUSED_CHARGE_PERCENT", default=0)
# Threads each web process (portal/asgi.py) runs Django's views on. A view holds one while it runs, and
# each may hold a database connection; the JupyterLab gateway does not use them.
WEB_THREADS = env.int("WEB_THREADS", default=4)
# Each web process reads the launch form's shared half (launch policy, enabled images and where they can
# start, hosts in service, open bonus programs) at most once in this many seconds; 0 reads it on every
# page. Launches themselves always read afresh.
LAUNCH_CATALOGUE_CACHE_SECONDS = env.int("LAUNCH_CATALOGUE_CACHE_SECONDS", default=5)
# How many instances (queued, provisioning, running or stopping) one user may have at once.
MAX_LIVE_INSTANCES_PER_USER = env.int("MAX_LIVE_INSTANCES_PER_USER", default=4)
# Sizes a user may launch only after a bonus application was approved (or an operator opened them to
# that user). Seeds the launch policy on a fresh install; operators change it in the console after that.
SIZES_REQUIRING_BONUS = env.list("SIZES_REQUIRING_BONUS", default=["8x"])
# How long provisioning waits for JupyterLab to answer /api/status before failing the launch.
READY_TIMEOUT_SECONDS = env.int("READY_TIMEOUT_SECONDS", default=180)
# How many instances one Docker engine brings up at once, per CPU of the engine (at least one); launches
# beyond that wait their turn in the order they came (provisioning/start_slots.py). 0: no limit.
LAUNCH_STARTS_PER_CPU = env.float("LAUNCH_STARTS_PER_CPU", default=2.0)
# How often beat charges running instances and compares the database with each host.
METER_TICK_SECONDS = env.int("METER_TICK_SECONDS", default=60)
RECONCILE_SECONDS = env.int("RECONCILE_SECONDS", default=60)
# How long the oldest queued 8x launch may wait before 1x launches queued behind it are held back,
# so busy hosts can drain for it.
SCHEDULER_8X_MAX_WAIT_SECONDS = env.int("SCHEDULER_8X_MAX_WAIT_SECONDS", default=600)
# The queue's fair share (portal/instances/queue.py): waiting launches go in order of their owner's GPU
# use over the last FAIR_SHARE_WINDOW_HOURS divided by their share (User.queue_share), least first; a
# launch that has waited longer than FAIR_SHARE_MAX_WAIT_SECONDS goes ahead of those by age, so no wait
# is unbounded. The queue's estimates also read that window's launches for the median wait.
FAIR_SHARE_WINDOW_HOURS = env.int("FAIR_SHARE_WINDOW_HOURS", default=168)
FAIR_SHARE_MAX_WAIT_SECONDS = env.int("FAIR_SHARE_MAX_WAIT_SECONDS", default=7200)
if FAIR_SHARE_WINDOW_HOURS < 1:
    raise ImproperlyConfigured("FAIR_SHARE_WINDOW_HOURS must be at least 1 (hour).")
if FAIR_SHARE_MAX_WAIT_SECONDS < 0:
    raise ImproperlyConfigured("FAIR_SHARE_MAX_WAIT_SECONDS must be 0 (first come, first served) or more.")
# Every HOST_HEARTBEAT_SECONDS beat pings each host's engine; a host unheard for
# HOST_DOWN_AFTER_MISSED_BEATS beats is marked down (no placements, its instances charged only up to its
# last heartbeat).
HOST_HEARTBEAT_SECONDS = env.int("HOST_HEARTBEAT_SECONDS", default=15)
HOST_DOWN_AFTER_MISSED_BEATS = env.int("HOST_DOWN_AFTER_MISSED_BEATS", default=3)
# An instance stuck in provisioning or stopping longer than this is repaired by the reconciler.
STUCK_TRANSITION_SECONDS = env.int("STUCK_TRANSITION_SECONDS", default=600)

# --- REST API (portal/api; the README's "API" section) ----------------------------------------
REST_FRAMEWORK = {
    # A personal access token (Authorization: Bearer dcp_...) or the portal session with its CSRF token.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.api.authentication.TokenAuthentication",
        "portal.api.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["portal.api.permissions.TokenScope"],
    "DEFAULT_THROTTLE_CLASSES": ["portal.api.throttling.PerTokenThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "portal.api.problems.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "DevCloud API",
    "DESCRIPTION": "Credits, images and instances of one DevCloud account. Errors are RFC 9457 problem details.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    # The docs page's JavaScript is served from this portal (drf-spectacular-sidecar), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
# Requests one token (or one browser session) may make, in DRF's syntax ("120/min", "2000/hour").
API_RATE_PER_TOKEN = env("API_RATE_PER_TOKEN", default="120/min")
# The longest a personal access token may live, in days (the Settings page offers up to this).
API_TOKEN_MAX_DAYS = env.int("API_TOKEN_MAX_DAYS", default=365)

# --- SSH gateway (portal/sshgateway; the README's "SSH" section) -------------------------------
# Where people reach the gateway: what they type after `ssh -J` (the settings page, the API's
# /api/v1/ssh and the CLI's `devcloud ssh` and `ssh-config` show it). The gateway process
# (`manage.py ssh_gateway`) listens on SSH_GATEWAY_BIND:SSH_GATEWAY_PORT; in production bind 0.0.0.0 (or
# the public address) and set SSH_GATEWAY_HOST to the name people use.
SSH_GATEWAY_HOST = env("SSH_GATEWAY_HOST", default="127.0.0.1")
SSH_GATEWAY_PORT = env.int("SSH_GATEWAY_PORT", default=2222)
SSH_GATEWAY_BIND = env("SSH_GATEWAY_BIND", default="127.0.0.1")
# The gateway's Ed25519 host key, made on first start and kept (clients remember it, so keep it across
# deploys and share it between gateways behind one name).
SSH_GATEWAY_HOST_KEY = env("SSH_GATEWAY_HOST_KEY", default=str(BASE_DIR / "var" / "ssh_gateway_host_ed25519_key"))
# How often beat rewrites each running instance's authorized_keys from its owner's account keys. Changes
# are pushed at once as well; this catches a push that failed.
SSH_KEYS_SYNC_SECONDS = env.int("SSH_KEYS_SYNC_SECONDS", default=30)

# --- Static files, i18n -----------------------------------------------------------------------
STATIC_URL = "/static/"
STATIC_ROOT = env("STATIC_ROOT", default=str(BASE_DIR / "var" / "static"))
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=14 * 24 * 3600)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    # httpx logs every proxied request at INFO.
    "loggers": {"axes": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

CELERY_BEAT_SCHEDULE = {
    # Each entry expires after one interval, so ticks do not pile up while the workers are down.
    "meter-tick": {
        "task": "provisioning.meter_tick",
        "schedule": float(METER_TICK_SECONDS),
        "options": {"expires": METER_TICK_SECONDS},
    },
    "reconcile": {
        "task": "provisioning.reconcile",
        "schedule": float(RECONCILE_SECONDS),
        "options": {"expires": RECONCILE_SECONDS},
    },
    "ssh-keys-sync": {
        "task": "sshgateway.sync_keys",
        "schedule": float(SSH_KEYS_SYNC_SECONDS),
        "options": {"expires": SSH_KEYS_SYNC_SECONDS},
    },
    "start-queued": {
        "task": "provisioning.start_queued",
        "schedule": float(METER_TICK_SECONDS),
        "options": {"expires": METER_TICK_SECONDS},
    },
    # Deleted accounts' workspace volumes left on hosts that did not answer (provisioning/workspaces.py).
    "remove-workspaces": {
        "task": "provisioning.remove_workspaces",
        "schedule": float(RECONCILE_SECONDS),
        "options": {"expires": RECONCILE_SECONDS},
    },
}
# Host health (provisioning/health.py, portal/instances/lifecycle.py hosts_heartbeat): every beat pings each
# host's engine; the instances of a host that went down are settled at its last heartbeat and stopped.
CELERY_BEAT_SCHEDULE["host-heartbeat"] = {
    "task": "provisioning.heartbeat",
    "schedule": float(HOST_HEARTBEAT_SECONDS),
    "options": {"expires": HOST_HEARTBEAT_SECONDS},
}
# How often beat records a capacity sample (GPUs allocated/total, launch queue) for the console's charts.
CONSOLE_SAMPLE_SECONDS = env.int("CONSOLE_SAMPLE_SECONDS", default=300)
CELERY_BEAT_SCHEDULE["console-sample"] = {"task": "console.record_sample", "schedule": float(CONSOLE_SAMPLE_SECONDS)}
# How many days of capacity samples the console keeps; beat deletes older ones every hour. The default
# covers the longest custom range the dashboard draws (portal/console/timeranges.py, MAX_CUSTOM_DAYS).
CONSOLE_SAMPLE_RETENTION_DAYS = env.int("CONSOLE_SAMPLE_RETENTION_DAYS", default=400)
CELERY_BEAT_SCHEDULE["console-sample-cleanup"] = {
    "task": "console.delete_old_samples",
    "schedule": 3600.0,
    "options": {"expires": 3600},
}
# How often idle culling checks every running instance (JupyterLab activity, GPU use).
IDLE_CULL_SECONDS = env.int("IDLE_CULL_SECONDS", default=60)
# gpu_busy_percent above this on any GPU an instance holds counts as use for idle culling.
IDLE_GPU_BUSY_PERCENT = env.int("IDLE_GPU_BUSY_PERCENT", default=5)
CELERY_BEAT_SCHEDULE["cull-idle"] = {
    "task": "provisioning.cull_idle",
    "schedule": float(IDLE_CULL_SECONDS),
    "options": {"expires": IDLE_CULL_SECONDS},
}
# How often beat stops instances that ran past their size's maximum session length (launch policy).
LIMITS_SECONDS = env.int("LIMITS_SECONDS", default=60)
# Renews the CI programme's grants (portal/projects/ci_grants.py). Hourly, so a renewal day missed while the
# workers were down is caught up within the hour; a run that finds nothing due changes nothing.
CELERY_BEAT_SCHEDULE["ci-grants-renew"] = {
    "task": "projects.renew_ci_grants",
    "schedule": 3600.0,
    "options": {"expires": 3600},
}
CELERY_BEAT_SCHEDULE["enforce-limits"] = {
    "task": "provisioning.enforce_limits",
    "schedule": float(LIMITS_SECONDS),
    "options": {"expires": LIMITS_SECONDS},
}
# Removes SSH keys past their expiry (a `devcloud run` key whose CLI was killed); they stopped being
# trusted at the expiry already.
CELERY_BEAT_SCHEDULE["ssh-keys-prune"] = {
    "task": "accounts.prune_expired_ssh_keys",
    "schedule": 300.0,
    "options": {"expires": 300},
}
# Settles reservations whose window ended (hold released, unused charge posted) and warns the booker
# before a window ends on the instances running in it (portal/instances/reservations.py).
CELERY_BEAT_SCHEDULE["reservations-settle"] = {
    "task": "instances.reservations_tick",
    "schedule": float(LIMITS_SECONDS),
    "options": {"expires": LIMITS_SECONDS},
}

# --- Operations: health and metrics (deploy/README.md) ---------------------------------------
# /metrics needs this bearer token (Authorization: Bearer <token>); empty = no token asked.
METRICS_TOKEN = env("METRICS_TOKEN", default="")
# Client networks allowed to read /metrics, e.g. "10.0.0.0/8,127.0.0.1/32" (the client address as
# TRUSTED_PROXY_COUNT resolves it). With both this and METRICS_TOKEN empty, /metrics answers 404.
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS", default=[])
