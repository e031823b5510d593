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


def test_the_console_and_the_api_docs_carry_a_content_security_policy_without_inline_code(api_a, console):
    """Scripts, styles, fonts and requests from this host only, no framing; the docs page keeps no inline script or
    style element (its start-up script is a file of its own, and is served as JavaScript)."""
    docs = api_a.get("/api/v1/docs/")
    for response in (docs, console.get("/admin/"), console.get("/admin/schedules/schedule/")):
        policy = dict(
            directive.strip().split(" ", 1)
            for directive in response["Content-Security-Policy"].split(";")
            if directive.strip()
        )
        assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'", policy
        assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'", policy
    pages = {"docs": docs, "dashboard": console.get("/admin/"), "list": console.get("/admin/schedules/schedule/")}
    for name, page in pages.items():
        html = page.content.decode()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), f"an inline script on the {name} page"
        assert "<style" not in html, f"an inline style element on the {name} page"
    html = docs.content.decode()
    start_up = re.search(r'<script src="(/api/v1/docs/\?[^"]*script[^"]*)"', html).group(1).replace("&amp;", "&")
    script = api_a.get(start_up)
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle" in script.content.decode()
