"""Request bodies decoded once, strictly, with errors that say where and what.

Litestar decodes a JSON body into plain Python values and then converts them
to the handler's Struct with lax rules (``"5"`` and ``5.0`` pass as an int).
:class:`BraidRequest` replaces that step: the body is decoded straight into
the handler's Struct by msgspec in strict mode, so the types in the OpenAPI
schema are the types accepted. It also refuses a body that is not JSON by
its ``Content-Type`` (415), names the byte where malformed JSON goes wrong,
and turns a body nested too deeply for the decoder into a 400.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ClientException, HTTPException, ValidationException
from litestar.status_codes import HTTP_415_UNSUPPORTED_MEDIA_TYPE
from litestar.types import Empty

__all__ = ["MAX_METADATA_DEPTH", "BraidRequest", "decode_body"]

#: Levels of objects and arrays a memory's ``metadata`` may nest (the object itself is level 1).
MAX_METADATA_DEPTH = 32

# A \uD800-\uDBFF escape not followed by a low one, or a \uDC00-\uDFFF escape
# not preceded by a high one; an even run of backslashes before it is text.
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
_AT = re.compile(r" - at `\$\.?(.*)`$")


class UnsupportedMediaType(HTTPException):
    status_code = HTTP_415_UNSUPPORTED_MEDIA_TYPE


def _is_json(content_type: str) -> bool:
    """JSON by its media type; a body sent without one is read as JSON."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("", "application/json") or (media.startswith("application/") and media.endswith("+json"))


def _malformed(body: bytes, exc: msgspec.DecodeError) -> str:
    message = str(exc)
    if message == "Input data was truncated":
        # msgspec says "truncated" for a lone surrogate escape too.
        lone = _LONE_SURROGATE.search(body)
        if lone is not None:
            escape = lone.group(1).decode("ascii")
            return (
                f"request body is not valid JSON: {escape} at byte {lone.start(1)} is a lone "
                "UTF-16 surrogate (a high surrogate must be followed by a low one)"
            )
        return f"request body is not valid JSON: it ends at byte {len(body)} before the JSON value does"
    return f"request body is not valid JSON: {message.removeprefix('JSON is malformed: ')}"


def decode_body(body: bytes, target: type[Any], content_type: str) -> Any:
    """``body`` as a ``target`` Struct, decoded strictly; raise the HTTP error that fits."""
    if not _is_json(content_type):
        shown = content_type.split(";", 1)[0].strip()
        raise UnsupportedMediaType(f"the body must be JSON sent with Content-Type: application/json, not {shown}")
    try:
        return msgspec.json.decode(body, type=target, strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc)
        at = _AT.search(message)
        text = message[: at.start()] if at else message
        error: dict[str, Any] = {"message": text, "source": "body"}
        if at and at.group(1):
            error["key"] = at.group(1)
        raise ValidationException(detail="Validation failed", extra=[error]) from None
    except msgspec.DecodeError as exc:
        raise ClientException(_malformed(body, exc)) from None
    except RecursionError:
        raise ClientException(
            "request body nests objects and arrays too deeply to decode; "
            f"metadata may nest at most {MAX_METADATA_DEPTH} levels"
        ) from None


class BraidRequest(Request[Any, Any, Any]):
    """A request whose ``json()`` is the handler's ``data`` Struct (see the module doc)."""

    async def json(self) -> Any:
        if self._json is Empty:
            cached = self._connection_state.json
            if cached is not Empty:
                self._json = cached
            else:
                field = self.route_handler.parsed_data_field
                target = Any if field is None else field.annotation
                body = await self.body()
                self._json = self._connection_state.json = decode_body(
                    body or b"null", target, self.headers.get("content-type") or ""
                )
        return self._json
