"""Refuses, up front, request input that no view could handle: oversized bodies (413) and NUL characters (400)."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError


class BodySizeLimitMiddleware:
    """DRF reads the request stream itself, which bypasses Django's DATA_UPLOAD_MAX_MEMORY_SIZE check."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
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
