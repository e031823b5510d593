"""Refuses oversized request bodies up front with a JSON 413, before any parser reads them."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


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
