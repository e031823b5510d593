"""Django settings: everything that differs between machines comes from the environment (12-factor)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from csp.constants import NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

from scheduler_project.database_url import platform_database
from scheduler_project.env import env_bool, env_fernet_keys, env_float, env_int, env_list, env_rate, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DJANGO_DEBUG", False)
# A fixed development key keeps local sessions valid across restarts on a developer's machine, where
# DJANGO_DEBUG is not set at all. Saying DJANGO_DEBUG=0 declares a real deployment: then the key must be the
# deployment's own (docs/API.md, "Configuration"), or anyone who read this file could forge sessions.
DEVELOPMENT_SECRET_KEY = "dev-only-insecure-key-change-me-in-production-0123456789"
PRODUCTION = "DJANGO_DEBUG" in os.environ and not DEBUG
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if (PRODUCTION or env_bool("DJANGO_REQUIRE_SECRET_KEY", False)) and SECRET_KEY in ("", DEVELOPMENT_SECRET_KEY):
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY must be set to a secret of this deployment when DJANGO_DEBUG=0 "
        "(for example: python -c 'import secrets; print(secrets.token_urlsafe(50))')."
    )
SECRET_KEY = SECRET_KEY or DEVELOPMENT_SECRET_KEY

# Behind a TLS-terminating proxy: HSTS, cookies only over HTTPS, and the proxy's header trusted for is_secure().
HTTPS = env_bool("SCHEDULER_HTTPS", False)
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SCHEDULER_HTTPS_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SCHEDULER_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    # Preloading is a promise to browsers that is slow to take back: an operator opts in.
    SECURE_HSTS_PRELOAD = env_bool("SCHEDULER_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        SILENCED_SYSTEM_CHECKS = ["security.W021"]
    SECURE_CONTENT_TYPE_NOSNIFF = True

# A leading dot accepts every subdomain: tenants live at <slug>.localhost in development.
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", ".localhost"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

SHARED_APPS = [
    "django_tenants",
    "tenants",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    # Admin login lockouts; its tables sit in the public schema with the operators they protect.
    "axes",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    # Swagger UI's assets as local static files: the API docs work on a machine without internet.
    "drf_spectacular_sidecar",
    "django_celery_results",
    "schedules",
    "dispatch",
]
# Each tenant's API users and tokens live in the tenant's own schema, so a token can only ever
# authenticate on its own tenant's host (the search path never reaches another tenant's schema).
TENANT_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    # Holds no keys since credentials migration 0002 moved them to digests; kept so that migration can read them.
    "rest_framework.authtoken",
    "tenants.credentials",
]
INSTALLED_APPS = SHARED_APPS + [app for app in TENANT_APPS if app not in SHARED_APPS]

TENANT_MODEL = "tenants.Tenant"
TENANT_DOMAIN_MODEL = "tenants.Domain"
PUBLIC_SCHEMA_URLCONF = "scheduler_project.urls_public"
ROOT_URLCONF = "scheduler_project.urls_tenant"

MIDDLEWARE = [
    # Static files (the console's CSS and JavaScript, the API docs' assets) are served by the web process itself,
    # in every mode, before tenant resolution: runserver serves none with DEBUG off, and no proxy is assumed.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "scheduler_project.middleware.BodySizeLimitMiddleware",
    "scheduler_project.middleware.NulCharacterMiddleware",
    "tenants.middleware.TenantHostMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy on every answer (CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: turns a login refused for a lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

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
            ],
        },
    },
]

WSGI_APPLICATION = "scheduler_project.wsgi.application"

# One server, or a primary and its standbys in libpq's multi-host form: every connection then finds the primary by
# itself, after a failover too. Checked, with health checks and jit=off (scheduler_project/database_url.py).
DATABASES = {
    "default": platform_database(
        env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/scheduler"),
        conn_max_age=env_int("SCHEDULER_DB_CONN_MAX_AGE", 60, minimum=0),
    )
}
DATABASE_ROUTERS = ["django_tenants.routers.TenantSyncRouter"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# django-axes first: it refuses a locked-out login before any backend checks the password.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# An operator's password opens every tenant's schedules: at least 12 characters, not like the user's name or e-mail,
# not one of the 20,000 most common passwords, not all digits (Django's four validators; the console's password
# change, createsuperuser and ensure_operator all apply them).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Compressed (gzip/brotli) copies made by collectstatic; no manifest, so a fresh checkout renders without it.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from the apps' static folders too, so static files work before (or without) collectstatic.
WHITENOISE_USE_FINDERS = True

# Request bodies above this are refused before parsing (413, scheduler_project/middleware.py), but for the fleet
# calls' larger limit there; Django's own check stands behind it at that limit. The payload has its own 64 KiB rule.
REQUEST_BODY_LIMIT = 256 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 32 * 1024 * 1024

# Django's cache, shared by every process through the database (the one shared store every deployment has); the
# table is created by schedules migration 0004, in the public schema, and is UNLOGGED. Nothing on the request path
# uses it: the API's request counters have a table of their own (schedules/api/throttles.py).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "scheduler_cache",
        "OPTIONS": {"MAX_ENTRIES": 20_000},
    }
}

# --- API request rates (schedules/api/throttles.py); a refused request answers 429 with Retry-After ---
# Each API token's own budget.
SCHEDULER_API_RATE = env_rate("SCHEDULER_API_RATE", "6000/min")
_api_rate_count, _api_rate_period = SCHEDULER_API_RATE.split("/")
# All tokens of one tenant together, so one tenant cannot take the control plane from the others; only
# authenticated requests count. The default leaves room for three tokens at their full rate.
SCHEDULER_API_TENANT_RATE = env_rate("SCHEDULER_API_TENANT_RATE", f"{3 * int(_api_rate_count)}/{_api_rate_period}")
# Requests without a valid token (the schema, the docs, a missing or bad token), per client address (an IPv6
# client per /64). They never touch a tenant's or a token's budget.
SCHEDULER_API_ANON_RATE = env_rate("SCHEDULER_API_ANON_RATE", "300/min")
# Reverse proxies in front of the web process that append the client's address to X-Forwarded-For. 0 (the default):
# the client address is REMOTE_ADDR and the header is ignored, since any client can write it. Used by the API
# throttles and the admin login lockout (scheduler_project/client_address.py).
SCHEDULER_NUM_PROXIES = env_int("SCHEDULER_NUM_PROXIES", 0, minimum=0, maximum=10)

# Keys that seal secrets at rest (core/sealing.py): Fernet keys, comma-separated; the first seals, all unseal.
# Unset: one derived from SECRET_KEY, which `check --deploy` flags (a database copy and SECRET_KEY together
# would then open the secrets). Make one with:
#   python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"
SCHEDULER_ENCRYPTION_KEYS = env_fernet_keys("SCHEDULER_ENCRYPTION_KEYS")

# API tokens (tenants.credentials): the lifetime of one issued without expires_at, and the longest any may have.
SCHEDULER_TOKEN_DEFAULT_DAYS = env_int("SCHEDULER_TOKEN_DEFAULT_DAYS", 90, minimum=1, maximum=3650)
SCHEDULER_TOKEN_MAX_DAYS = env_int("SCHEDULER_TOKEN_MAX_DAYS", 365, minimum=SCHEDULER_TOKEN_DEFAULT_DAYS, maximum=3650)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tenants.credentials.authentication.DigestTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "tenants.credentials.authentication.TokenScopePermission",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": env_int("SCHEDULER_API_PAGE_SIZE", 50, minimum=1, maximum=1000),
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "schedules.api.filters.KnownParametersOnly",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": [
        "schedules.api.throttles.ApiClientThrottle",
        "schedules.api.throttles.AddressRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "token": SCHEDULER_API_RATE,
        "tenant": SCHEDULER_API_TENANT_RATE,
        "anon": SCHEDULER_API_ANON_RATE,
    },
    "NUM_PROXIES": SCHEDULER_NUM_PROXIES,
    "EXCEPTION_HANDLER": "schedules.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Scheduler platform API",
    "DESCRIPTION": "Cron and one-off schedules in IANA time zones, delivered at least once to registered handlers.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # 3.1 is JSON Schema: `null` as a type and `propertyNames` say exactly what the API accepts (payload keys).
    "OAS_VERSION": "3.1.0",
    # Bodies are documented as JSON, the contract (docs/API.md, "Requests"); the form parsers serve the browsable API.
    "PARSER_WHITELIST": ["rest_framework.parsers.JSONParser"],
    # One name per set of choices, wherever it appears (input, output, filters): no hash-suffixed names.
    "ENUM_NAME_OVERRIDES": {
        "KindEnum": "core.choices.Kind",
        "TokenScopeEnum": "tenants.credentials.models.TokenScope",
        "NotificationEventEnum": "tenants.models.NotificationEvent",
        "LaneEnum": "core.choices.Lane",
        "MisfirePolicyEnum": "core.choices.MisfirePolicy",
        "OverlapPolicyEnum": "core.choices.OverlapPolicy",
        "ScheduleStateEnum": "core.choices.ScheduleState",
        "OccurrenceStateEnum": "dispatch.models.OccurrenceState",
        "HandlerEnum": "dispatch.handlers.registered_names",
    },
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "schedules.api.document.finish"],
}

# --- Celery (RabbitMQ broker; django-celery-results keeps Celery's own task results) ---
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
CELERY_RESULT_BACKEND = "django-db"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- Scheduler tunables (SCHEDULER_*) ---
# Schedules are spread over this many logical shards (shard = id mod N); materializers lease shards.
# Changing it re-shards nothing already stored, so it is fixed per deployment.
SCHEDULER_SHARDS = env_int("SCHEDULER_SHARDS", 256, minimum=1, maximum=65536)
# Payloads are stored and shipped with every occurrence: keep them small.
SCHEDULER_MAX_PAYLOAD_BYTES = env_int("SCHEDULER_MAX_PAYLOAD_BYTES", 64 * 1024, minimum=1024)
# How far ahead occurrences are materialized (docs/ARCHITECTURE.md rule 2): covers failover and enqueue budgets, and
# the time to write a top-of-hour batch. Measured: one materializer writes 20,000-30,000 schedules/s on two cores, so a
# 500,000-fire hour takes ~25 s; 60 s leaves a lease period (15 s) of failover and as much again of margin
# (docs/SCALING.md). Longer costs at every update and cancel: more pending work of the old version to withdraw.
SCHEDULER_HORIZON_SECONDS = env_float("SCHEDULER_HORIZON_SECONDS", 60.0, minimum=1.0)
# Retry-After sent with a 429 for the schedule-count quota: a count frees up only when a user acts.
SCHEDULER_QUOTA_RETRY_AFTER_SECONDS = env_int("SCHEDULER_QUOTA_RETRY_AFTER_SECONDS", 60, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("SCHEDULER_LOG_LEVEL", "INFO")},
    # The AMQP clients log every frame at DEBUG: at SCHEDULER_LOG_LEVEL=DEBUG a relay wrote ~30 lines a publish,
    # burying the product's own lines and slowing the loop it was meant to explain.
    "loggers": {name: {"level": "WARNING"} for name in ("django.db.backends", "aio_pika", "aiormq")},
}

# Content-Security-Policy (django-csp): the console, the API docs and every other page load scripts, styles, images
# and fonts from this host only, send forms and requests to it only, and may not be framed. No inline script
# anywhere (the API docs' start-up script is a file of its own: SpectacularSwaggerSplitView). Inline style
# attributes are allowed (style-src-attr): the console's templates set widths with them, and a style attribute
# cannot run code; style elements must come from this host.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "style-src-attr": [UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# When set, /metrics answers only a scrape with `Authorization: Bearer <token>` (or a superuser's console session):
# it names every tenant and its activity. Unset, it is open (a private network's Prometheus).
SCHEDULER_METRICS_TOKEN = env_str("SCHEDULER_METRICS_TOKEN", "")
# Hosts that serve the operator console, /metrics and /healthz (the public schema).
SCHEDULER_PUBLIC_HOSTS = env_list("SCHEDULER_PUBLIC_HOSTS", ["localhost", "127.0.0.1"])

# --- Operator console login lockout (django-axes) ---
# After this many failed logins for one username from one client address, that pair is locked out; the same
# operator from another address, and other usernames from this one, are not (a guesser cannot lock operators out).
SCHEDULER_ADMIN_LOGIN_FAILURE_LIMIT = env_int("SCHEDULER_ADMIN_LOGIN_FAILURE_LIMIT", 5, minimum=1)
# How long a lockout lasts; every attempt during it, right password or not, starts it again.
SCHEDULER_ADMIN_LOCKOUT_SECONDS = env_int("SCHEDULER_ADMIN_LOCKOUT_SECONDS", 900, minimum=1)
AXES_FAILURE_LIMIT = SCHEDULER_ADMIN_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(seconds=SCHEDULER_ADMIN_LOCKOUT_SECONDS)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# A successful login forgets the earlier failures of that username and address.
AXES_RESET_ON_SUCCESS = True
# The same address rules as the API throttles: X-Forwarded-For only behind SCHEDULER_NUM_PROXIES proxies.
AXES_CLIENT_IP_CALLABLE = "scheduler_project.client_address.client_address"
# The console's own lockout page (429 with Retry-After) instead of axes' bare text.
AXES_LOCKOUT_CALLABLE = "scheduler_project.lockout.lockout_response"
# No start-up banner from every manage.py command; lockouts are still logged as warnings.
AXES_VERBOSE = False

# Occurrences per envelope, the unit the relay confirms and a worker claims in one transaction; a message carries
# envelopes due together up to this many fires, and a lane's small ones up to four times as many (docs/DESIGN.md
# "Bundles" and "Crowds"). 250
# (~15 KB) measured best on two cores (docs/BENCHMARKS.md): against 100, 500,000 strict fires reached the broker
# with p99 1.35 s instead of 3.6 s and workers ran 7,000 occurrences/s instead of 5,400; at 500 the relay gained
# little more and the workers lost parallelism.
SCHEDULER_ENVELOPE_SIZE = env_int("SCHEDULER_ENVELOPE_SIZE", 250, minimum=1, maximum=1000)
# Schedules planned per materializer transaction. An envelope holds one batch's fires of a tenant, lane and instant,
# so the batch decides how many envelopes a burst becomes: at 2,000, a 100,000-fire burst over 1,000 tenants was
# ~50,000 envelopes of two fires and reached the broker up to 10-18 s late under steady load; at 20,000 it is ~5,000
# envelopes and lag p99 was 0.75 s, and the steady day writes one envelope per tenant and second (docs/BENCHMARKS.md
# "Claims that wait for a held row"). The price: an API edit of a schedule in the batch waits for it (about a second
# at its largest), and the materializer's memory peaks near 200 MB instead of 100 MB.
SCHEDULER_MATERIALIZE_BATCH = env_int("SCHEDULER_MATERIALIZE_BATCH", 20000, minimum=1)
# Shard lease length; renewed every third of it. A dead materializer's shards move after at most this long,
# which the horizon must cover.
SCHEDULER_LEASE_SECONDS = env_float("SCHEDULER_LEASE_SECONDS", 15.0, minimum=1.0)
SCHEDULER_MATERIALIZE_IDLE_SECONDS = env_float("SCHEDULER_MATERIALIZE_IDLE_SECONDS", 1.0, minimum=0.01)
# Batches a materializer process writes at the same time, each in its own transaction on its own connection: while
# one waits for PostgreSQL, another plans in Python (SKIP LOCKED keeps them on different cursors). On two cores, two
# left a tenth of the CPU idle once the Python side was lean; three measured best (docs/BENCHMARKS.md, round 3).
SCHEDULER_MATERIALIZE_THREADS = env_int("SCHEDULER_MATERIALIZE_THREADS", 3, minimum=1, maximum=16)
# Envelopes the relay claims and keeps in flight per transaction (each holds up to SCHEDULER_ENVELOPE_SIZE). Large
# enough to stage a whole top-of-hour burst before its instant (500,000 fires came in 2,510 envelopes: the
# materializer writes one per tenant and batch); with 500 the burst left in five steps, each waiting for the one
# before it (p99 2.2 s against 0.5-0.9 s, docs/BENCHMARKS.md). About 15 KB an envelope in memory.
SCHEDULER_RELAY_BATCH = env_int("SCHEDULER_RELAY_BATCH", 4000, minimum=1)
# The part of a relay batch flexible work keeps while strict work is due: the strict lane has the rest reserved,
# and flexible work is never starved by a strict burst.
SCHEDULER_FLEXIBLE_MIN_SHARE = env_float("SCHEDULER_FLEXIBLE_MIN_SHARE", 0.1, minimum=0.0, maximum=1.0)
# The most published envelopes one settle statement copies onto their occurrences. The settler starts at 20 and
# doubles or halves its batch to keep each statement near 0.1 s (dispatch/engine/settler.py): the rows it locks are
# the ones the workers are claiming and completing.
SCHEDULER_SETTLE_BATCH = env_int("SCHEDULER_SETTLE_BATCH", 500, minimum=1)
# A crowded instant: more fires of one lane released by a relay at one instant than this (a top-of-hour burst, every
# cron of a fleet on the same minute). Its messages go to the lane's crowd queue (the lane's name + ".crowd") instead
# of the lane's own; workers consume both and RabbitMQ hands their messages out in turn, so a fire due alone after a
# crowd waits for a share of it, not for all of it (docs/DESIGN.md "Crowds"). Above a steady second of the seed's
# load (2,315 fires) and below what the workers of two cores run in two seconds. 0 sends every fire to its lane's queue.
SCHEDULER_CROWD_FIRES = env_int("SCHEDULER_CROWD_FIRES", 10000, minimum=0)
# Longest nap of an idle relay: new envelopes for "now" (manual triggers, retries) wait at most this long.
SCHEDULER_RELAY_MAX_IDLE_SECONDS = env_float("SCHEDULER_RELAY_MAX_IDLE_SECONDS", 0.25, minimum=0.01)
# Durable queues per lane, each with its crowd queue beside it (the workers consume all four by default).
SCHEDULER_STRICT_QUEUE = env_str("SCHEDULER_STRICT_QUEUE", "scheduler.strict")
SCHEDULER_FLEXIBLE_QUEUE = env_str("SCHEDULER_FLEXIBLE_QUEUE", "scheduler.flexible")
# The lanes' queue type: "classic" (one node, the default) or "quorum" (replicated across a RabbitMQ cluster;
# docs/SCALING.md measures the difference). Changing it on existing queues needs them deleted first, the crowd queues
# too (RabbitMQ refuses to redeclare a queue with another type); drain them before.
SCHEDULER_QUEUE_TYPE = env_str("SCHEDULER_QUEUE_TYPE", "classic")
if SCHEDULER_QUEUE_TYPE not in ("classic", "quorum"):
    raise ImproperlyConfigured(f"SCHEDULER_QUEUE_TYPE={SCHEDULER_QUEUE_TYPE!r}: use classic or quorum.")
# The relay claims envelopes due within this lead and releases each at its instant from memory, so the top of
# the hour starts on time; a manual trigger may wait up to this long behind a staged group.
SCHEDULER_RELAY_STAGE_SECONDS = env_float("SCHEDULER_RELAY_STAGE_SECONDS", 1.0, minimum=0.0)
# A publish the broker has not confirmed within this long fails (a broker blocked by a memory or disk alarm never
# confirms): its envelope goes back unstamped and the relay backs off like in any outage. No transaction is open
# meanwhile.
SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS = env_float("SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS", 10.0, minimum=0.1)
# How long a relay's lease on the envelopes it claimed lasts: longer than the staging lead plus the publish timeout,
# so a live relay never loses a lease mid-publish. A lease of a relay no longer connected to PostgreSQL is taken over
# at once; this expiry only frees the envelopes of a relay that is connected but stuck.
SCHEDULER_RELAY_LEASE_SECONDS = env_float("SCHEDULER_RELAY_LEASE_SECONDS", 60.0, minimum=1.0)
if SCHEDULER_RELAY_LEASE_SECONDS <= SCHEDULER_RELAY_STAGE_SECONDS + SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS:
    raise ImproperlyConfigured(
        f"SCHEDULER_RELAY_LEASE_SECONDS={SCHEDULER_RELAY_LEASE_SECONDS:g} must exceed SCHEDULER_RELAY_STAGE_SECONDS "
        f"plus SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS ({SCHEDULER_RELAY_STAGE_SECONDS:g} + "
        f"{SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS:g}): a live relay would lose envelopes it is still publishing."
    )

# --- Workers ---
# How much lower a Celery worker's CPU priority is than the engine's (os.nice when the worker starts; its pool
# processes inherit it). Where workers share a host with a relay or materializer, the handlers must not take the CPU
# a burst's instant needs (docs/DESIGN.md "The engine before the handlers"). On a host of its own a worker loses
# nothing. 0 leaves it.
SCHEDULER_WORKER_NICENESS = env_int("SCHEDULER_WORKER_NICENESS", 5, minimum=0, maximum=19)
# Occurrences of one envelope run in parallel on this many threads per worker process.
SCHEDULER_WORKER_THREADS = env_int("SCHEDULER_WORKER_THREADS", 8, minimum=1, maximum=256)
# The part of those threads one tenant's handlers may hold at once (at least one thread): the rest stay free for
# other tenants however long this tenant's handlers hang (docs/DESIGN.md "Isolation in the worker pool").
SCHEDULER_WORKER_TENANT_SHARE = env_float("SCHEDULER_WORKER_TENANT_SHARE", 0.5, minimum=0.01, maximum=1.0)
# The longest an envelope keeps its worker process: what has not started by then is handed back under its own ids
# (attempts untouched, due at once, behind what other tenants have queued), and handlers still running finish on
# the pool. A handler running longer counts as slow: a tenant whose share is held by slow handlers is not claimed
# on that process until they end. 250 noop fires take a few hundredths of a second.
SCHEDULER_ENVELOPE_SLICE_SECONDS = env_float("SCHEDULER_ENVELOPE_SLICE_SECONDS", 1.0, minimum=0.05)
# How often every process flushes its counters into PostgreSQL and writes its heartbeat (relays, worker pool
# processes). /healthz and the console call a process silent after two shard leases without one.
SCHEDULER_HEARTBEAT_SECONDS = env_float("SCHEDULER_HEARTBEAT_SECONDS", 5.0, minimum=0.1)
# /healthz (and the console's banner) says "degraded" when the earliest active cursor, or the oldest due envelope not
# held by its tenant's fire rate, is further than this behind now.
SCHEDULER_HEALTH_BEHIND_SECONDS = env_float("SCHEDULER_HEALTH_BEHIND_SECONDS", 60.0, minimum=1.0)
# A claim's lease; renewed every third of it by a heartbeat. A dead worker's occurrence is reclaimable after it.
SCHEDULER_WORKER_LEASE_SECONDS = env_float("SCHEDULER_WORKER_LEASE_SECONDS", 30.0, minimum=1.0)
# queue_one: how soon an occurrence waiting for its running predecessor is offered again.
SCHEDULER_OVERLAP_RECHECK_SECONDS = env_float("SCHEDULER_OVERLAP_RECHECK_SECONDS", 5.0, minimum=0.1)
# max_running: an occurrence over its tenant's quota is offered again after a quarter of its wait so far, at least
# the first and at most the second of these (jittered).
SCHEDULER_RUNNING_RECHECK_SECONDS = env_float("SCHEDULER_RUNNING_RECHECK_SECONDS", 1.0, minimum=0.05)
SCHEDULER_RUNNING_RECHECK_MAX_SECONDS = env_float("SCHEDULER_RUNNING_RECHECK_MAX_SECONDS", 30.0, minimum=0.05)
# Transient failures back off exponentially with equal jitter: c/2 + uniform(0, c/2), c = min(cap, base * 2**(a-1)); a
# schedule's retry_base_seconds / retry_cap_seconds replace these. At least 1, 2, 4, 8 s: five attempts span 15 s.
SCHEDULER_RETRY_BASE_SECONDS = env_float("SCHEDULER_RETRY_BASE_SECONDS", 2.0, minimum=0.0)
SCHEDULER_RETRY_CAP_SECONDS = env_float("SCHEDULER_RETRY_CAP_SECONDS", 300.0, minimum=0.0)
# A handler still running after this is asked to stop (cancel event); below RabbitMQ's consumer timeout.
SCHEDULER_HANDLER_TIMEOUT_SECONDS = env_float("SCHEDULER_HANDLER_TIMEOUT_SECONDS", 900.0, minimum=1.0)
# Extra modules whose @handler functions workers (and the API's validation) know, comma-separated.
SCHEDULER_HANDLER_MODULES = env_list("SCHEDULER_HANDLER_MODULES", [])
# The webhook handler refuses loopback, private, link-local and reserved addresses (a tenant picks the URL); an
# operator whose receivers live on a private network allows them here.
SCHEDULER_WEBHOOK_ALLOW_PRIVATE = env_bool("SCHEDULER_WEBHOOK_ALLOW_PRIVATE", False)
# Days of occurrences and attempts kept before their day partitions are dropped: by the materializers' upkeep once
# an hour, or by prune_occurrences. A day holding a fire that can still run is kept until it has finished.
SCHEDULER_RETENTION_DAYS = env_int("SCHEDULER_RETENTION_DAYS", 14, minimum=1)

# --- Upkeep (dispatch/upkeep.py, a thread of every materializer): day partitions, retention, vacuum ---
# The longest any upkeep statement waits for a lock (partition DDL, drops, VACUUM) before it gives up and tries again
# later. A long read of the occurrence table (a report, pg_dump) then pauses the data plane's statements that wait
# behind the DDL for at most this long, instead of queueing every write until the read ends.
SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS = env_float(
    "SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS", 0.25, minimum=0.001, maximum=10.0
)
# How soon an upkeep task that gave up (a lock busy past the timeout) or failed is tried again.
SCHEDULER_UPKEEP_RETRY_SECONDS = env_float("SCHEDULER_UPKEEP_RETRY_SECONDS", 60.0, minimum=0.1)
# Day partitions are kept ready this many days after today, so days of failed tries cost nothing: rows of a day
# without its partition land in DEFAULT, and the day can never have a partition of its own after that.
SCHEDULER_PARTITION_DAYS_AHEAD = env_int("SCHEDULER_PARTITION_DAYS_AHEAD", 7, minimum=2, maximum=60)
# A table autovacuum does not look after (off on the server, or autovacuum_enabled=false on the table) is vacuumed
# by the upkeep once its dead row versions pass this many plus a fifth of its live rows (autovacuum's own formula,
# with a larger base; the upkeep looks every ten seconds).
SCHEDULER_VACUUM_DEAD_TUPLES = env_int("SCHEDULER_VACUUM_DEAD_TUPLES", 1_000, minimum=1)

# Fault injection (dispatch/engine/faults.py): a crash point's name makes the process die there, at the
# SCHEDULER_FAULT_AFTER-th pass. Empty (the default) in every real deployment.
SCHEDULER_FAULT = env_str("SCHEDULER_FAULT", "")
SCHEDULER_FAULT_AFTER = env_int("SCHEDULER_FAULT_AFTER", 1, minimum=1)

# --- Worker limits on retries and leases ---
# No retry of an occurrence is scheduled later than this after its scheduled_for: past it the occurrence goes dead
# ("deadline passed"). Forced ones (backfill, replay) are exempt: they are re-driven long after their time.
SCHEDULER_OCCURRENCE_DEADLINE_SECONDS = env_float("SCHEDULER_OCCURRENCE_DEADLINE_SECONDS", 86400.0, minimum=1.0)
# A lease is renewed at most this long after its claim, even if the handler ignores its cancel event and keeps
# running; then it expires and the attempt is fenced. Default: the handler timeout plus two leases of grace.
SCHEDULER_LEASE_MAX_LIFETIME_SECONDS = env_float(
    "SCHEDULER_LEASE_MAX_LIFETIME_SECONDS",
    SCHEDULER_HANDLER_TIMEOUT_SECONDS + 2 * SCHEDULER_WORKER_LEASE_SECONDS,
    minimum=1.0,
)
# A worker ends a first delivery as missed when it is claimed later than its schedule's max lateness plus this grace
# (docs/ARCHITECTURE.md rule 12). The grace absorbs the pipeline's own latency (relay, broker, a worker's prefetch),
# which is no outage; without it a schedule with max_lateness_seconds = 0 could never run. The enqueue SLO's 5 s by
# default.
SCHEDULER_CLAIM_LATENESS_GRACE_SECONDS = env_float("SCHEDULER_CLAIM_LATENESS_GRACE_SECONDS", 5.0, minimum=0.0)
