"""The console and the API docs work out of the box and offline: static files come from the web process itself."""

from __future__ import annotations

import re

from django.test import Client


def test_the_admin_stylesheet_is_served_by_the_web_process_with_debug_off(settings, db):
    assert not settings.DEBUG
    response = Client(HTTP_HOST="localhost").get("/static/admin/css/base.css")
    assert response.status_code == 200
    content = b"".join(response.streaming_content) if response.streaming else response.content
    assert b"body" in content


def test_the_api_docs_load_every_asset_from_this_machine(api_a):
    page = api_a.get("/api/v1/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert not re.search(r"https?://(?!acme\.localhost)", html), "no asset from another host (offline machine)"
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert any("swagger-ui" in asset for asset in assets), assets
    for asset in assets:
        assert api_a.get(asset).status_code == 200, asset
