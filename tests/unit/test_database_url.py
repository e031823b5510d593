"""DATABASE_URL in libpq's multi-host form (scheduler_project/database_url.py): parsed for Django, written back for
the processes a process starts, and passed on to the relay's own connections (dispatch/sql database_conninfo)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from dispatch.sql import database_conninfo
from scheduler_project.database_url import database_url, parse_database_url

CLUSTER = "postgres://postgres@db1:5441,db2:5442/scheduler?target_session_attrs=read-write&connect_timeout=5"


def test_one_host_parses_as_dj_database_url_does():
    config = parse_database_url("postgres://app:secret@db1:5433/scheduler", conn_max_age=60)

    assert (config["HOST"], config["PORT"], config["USER"], config["PASSWORD"]) == ("db1", 5433, "app", "secret")
    assert (config["NAME"], config["CONN_MAX_AGE"]) == ("scheduler", 60)


def test_several_hosts_become_libpqs_lists_with_their_parameters():
    config = parse_database_url(CLUSTER)

    assert (config["HOST"], config["PORT"]) == ("db1,db2", "5441,5442")
    assert config["OPTIONS"] == {"target_session_attrs": "read-write", "connect_timeout": 5}
    assert config["NAME"] == "scheduler"


def test_a_host_without_a_port_takes_the_default_and_v6_addresses_keep_their_colons():
    config = parse_database_url("postgres://u@[::1]:5441,db2/x")

    assert (config["HOST"], config["PORT"]) == ("::1,db2", "5441,5432")


def test_an_empty_host_in_the_list_is_refused():
    with pytest.raises(Exception, match="valid url"):
        parse_database_url("postgres://u@db1:5441,,db2/x")


def test_database_url_writes_back_what_parse_read():
    config = parse_database_url(CLUSTER)

    assert database_url(config) == CLUSTER
    assert parse_database_url(database_url(config))["HOST"] == "db1,db2"


def test_database_url_of_one_host_keeps_its_simple_form():
    config = parse_database_url("postgres://postgres@127.0.0.1:5432/scheduler")
    config["OPTIONS"] = {"options": "-c jit=off"}  # what settings.py adds: not written back, settings adds it again

    assert database_url(config) == "postgres://postgres@127.0.0.1:5432/scheduler"


def test_the_relays_conninfo_carries_the_hosts_and_libpq_parameters(monkeypatch):
    config = parse_database_url(CLUSTER)
    for key in ("HOST", "PORT", "NAME"):
        monkeypatch.setitem(connection.settings_dict, key, config[key])
    options = {**config["OPTIONS"], "options": "-c jit=off", "isolation_level": 1}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)

    parsed = psycopg.conninfo.conninfo_to_dict(database_conninfo())

    assert parsed["host"] == "db1,db2" and parsed["port"] == "5441,5442"
    assert parsed["target_session_attrs"] == "read-write" and parsed["connect_timeout"] == "5"
    assert parsed["options"] == "-c jit=off"
    assert "isolation_level" not in parsed  # Django's own option, not libpq's
