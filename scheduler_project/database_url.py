"""DATABASE_URL with libpq's multi-host form, both ways.

A deployment with a standby names both servers, `postgres://user@db1:5432,db2:5432/scheduler?target_session_attrs=
read-write`, and every connection (Django's, the relay's and the settler's own) lands on whichever one is the primary
now, after a failover too (docs/DEPLOYMENT.md). dj-database-url refuses that form (it reads one host and one port), so
the hosts are taken apart here and handed to Django as libpq's lists, `HOST="db1,db2"` and `PORT="5432,5432"`, which
psycopg passes to libpq as they are. The query string's libpq parameters (target_session_attrs, connect_timeout)
stay in OPTIONS, where Django passes them to every connection.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit, urlunsplit

import dj_database_url
import psycopg
from django.core.exceptions import ImproperlyConfigured

DEFAULT_PORT = "5432"
# Connection parameters Django's OPTIONS may hold that are not libpq's (psycopg's or Django's own).
_NOT_LIBPQ = {"options"}


def parse_database_url(url: str, **kwargs: Any) -> dict[str, Any]:
    """dj_database_url.parse, which also takes several `host:port` pairs separated by commas."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return dict(dj_database_url.parse(url, **kwargs))
    pairs = [_host_port(host) for host in hosts.split(",")]
    if any(not host for host, _ in pairs):
        raise dj_database_url.ParseError()
    single = urlunsplit(parts._replace(netloc=f"{userinfo}{at}placeholder"))
    config = dict(dj_database_url.parse(single, **kwargs))
    config["HOST"] = ",".join(host for host, _ in pairs)
    # libpq takes one port for every host or one per host: one per host, the default where a host names none.
    config["PORT"] = ",".join(port or DEFAULT_PORT for _, port in pairs) if any(port for _, port in pairs) else ""
    return config


def platform_database(url: str, *, conn_max_age: int) -> dict[str, Any]:
    """The DATABASES entry of DATABASE_URL: PostgreSQL through django-tenants' backend."""
    database = parse_database_url(url, conn_max_age=conn_max_age)
    if database["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_URL must point at PostgreSQL (postgres://...).")
    database["ENGINE"] = "django_tenants.postgresql_backend"
    # Persistent connections are checked before reuse: after a PostgreSQL restart or failover a request (or a worker
    # thread) gets a fresh connection instead of an error from the dead one.
    database["CONN_HEALTH_CHECKS"] = True
    # No JIT compilation on the platform's connections. Its statements are short, and their generic plans (prepared
    # statements, after five runs) estimate from arrays of unknown length, often above jit_above_cost: the settle
    # statement then spent 3.5 s compiling for 5 ms of work, every run (docs/DESIGN.md "No JIT"). The relay's own
    # connections take the same options (dispatch/sql/__init__.py database_conninfo).
    options = database.setdefault("OPTIONS", {})
    options["options"] = f"{options.get('options', '')} -c jit=off".strip()
    return database


def database_url(settings_dict: dict[str, Any]) -> str:
    """A DATABASES entry as a DATABASE_URL, hosts and libpq parameters kept: what a process hands the processes it
    starts, so they use the same servers the same way."""
    user = quote(settings_dict.get("USER") or "postgres", safe="")
    password = f":{quote(settings_dict['PASSWORD'], safe='')}" if settings_dict.get("PASSWORD") else ""
    hosts = str(settings_dict.get("HOST") or "127.0.0.1").split(",")
    ports = str(settings_dict.get("PORT") or DEFAULT_PORT).split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    netloc = ",".join(f"{_bracketed(host)}:{port}" for host, port in zip(hosts, ports, strict=True))
    options = {key: value for key, value in (settings_dict.get("OPTIONS") or {}).items() if key in libpq_parameters()}
    return urlunsplit(("postgres", f"{user}{password}@{netloc}", f"/{settings_dict['NAME']}", urlencode(options), ""))


def libpq_parameters() -> set[str]:
    """The keywords libpq takes in a conninfo string (but `options`, which settings.py builds itself)."""
    return {item.keyword.decode() for item in psycopg.pq.Conninfo.get_defaults()} - _NOT_LIBPQ


def _host_port(text: str) -> tuple[str, str]:
    """`host`, `host:port`, `[v6]` or `[v6]:port`, percent-decoded."""
    text = unquote(text)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, rest.removeprefix(":")
    host, _, port = text.partition(":")
    return host, port


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
