"""Refuses, up front, request input that no view could handle: oversized bodies (413) and NUL characters (400)."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError

# The fleet calls name up to 10,000 schedules (schedules/fleet.py MAX_FLEET): an apply document holds as many
# definitions, each with a payload of up to 64 KiB, a bulk call as many ids (400 KB). Those two take bodies up to this
# size (Django's DATA_UPLOAD_MAX_MEMORY_SIZE), every other endpoint REQUEST_BODY_LIMIT.
FLEET_PATH_SUFFIXES = ("/schedules/apply/", "/schedules/bulk/")


class BodySizeLimitMiddleware:
    """One body limit for every path, judged by Content-Length before anything reads the body."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        fleet = request.path.endswith(FLEET_PATH_SUFFIXES)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE if fleet else settings.REQUEST_BODY_LIMIT
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse({"detail": "Invalid Content-Length header."}, status=400)
        if limit is not None and length > limit:
            return JsonResponse(
                {"detail": f"Request body of {length} bytes exceeds the limit of {limit} bytes."}, status=413
            )
        return self.get_response(request)


FORM_CONTENT_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class NulCharacterMiddleware:
    """A U+0000 in a query parameter or a form field is refused with a 400: PostgreSQL cannot store or compare
    it in text (the console's filters and forms would end in a DataError, a 500). JSON bodies are the API
    parsers' and serializers' to check, with field-level messages."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        sources = [request.GET]
        if request.method == "POST" and request.content_type in FORM_CONTENT_TYPES:
            try:
                sources.append(request.POST)
            except (MultiPartParserError, SuspiciousOperation):
                # Django would answer these with its HTML error page; the API answers in JSON.
                return JsonResponse({"detail": "The form body could not be parsed."}, status=400)
        for source in sources:
            for key, values in source.lists():
                if "\x00" in key or any("\x00" in value for value in values):
                    return JsonResponse(
                        {"detail": "The request contains a NUL character (U+0000), which is not accepted."},
                        status=400,
                    )
        return self.get_response(request)
