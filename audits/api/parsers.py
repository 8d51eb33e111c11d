from __future__ import annotations

import json

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from audits.api.errors import PayloadTooLarge


class BoundedJSONParser(JSONParser):
    """JSON with a size cap read before parsing, and deep nesting refused as a 400."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.API_MAX_BODY_BYTES
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"Request body must be at most {limit} bytes.")
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"Request body must be at most {limit} bytes.")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError(
                "Request body must be UTF-8 encoded JSON.", code="malformed_json"
            ) from None
        try:
            return json.loads(text)
        except RecursionError:
            raise ParseError("Request body is nested too deeply.", code="malformed_json") from None
        except ValueError as exc:
            raise ParseError(
                f"Request body is not valid JSON: {exc}", code="malformed_json"
            ) from None
