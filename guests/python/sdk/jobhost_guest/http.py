"""Outbound HTTP from a Python handler, over the standard ``wasi:http``
interface the host serves through its allow-list (docs/outbound.md).
Built against the ``job-http`` world (guests/python/build.sh does).

    from jobhost_guest import http

    answer = http.get("https://api.example.com/v1/things", headers={"authorization": "Bearer " + key})
    answer.status, answer.json()
    http.post("https://api.example.com/v1/things", json={"name": "x"})

A request the host refuses (not declared, not granted, a private address)
or one that fails on the way raises ``HttpError``, whose ``code`` is the
wasi:http error's name (``HttpRequestDenied``, ``ConnectionTimeout``…);
the job's log then says why and, for a refusal, which grant would allow it.
"""

import json as _json
from urllib.parse import urlsplit

from componentize_py_types import Err
from wit_world.imports import outgoing_handler, streams
from wit_world.imports import wasi_http_types as wasi

__all__ = ["Response", "HttpError", "request", "get", "post"]

_CHUNK = 64 * 1024
_METHODS = {
    "GET": wasi.Method_Get(), "HEAD": wasi.Method_Head(), "POST": wasi.Method_Post(), "PUT": wasi.Method_Put(),
    "DELETE": wasi.Method_Delete(), "PATCH": wasi.Method_Patch(), "OPTIONS": wasi.Method_Options(),
}


class HttpError(Exception):
    """A request that was refused or failed; ``code`` names the wasi:http error."""

    def __init__(self, code, detail=None):
        self.code = code
        super().__init__(code if detail is None else "%s: %s" % (code, detail))


class Response:
    """A response read whole: ``status``, ``headers`` (lower-case names), ``body`` (bytes)."""

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def text(self):
        return self.body.decode("utf-8", "replace")

    def json(self):
        return _json.loads(self.body)


def _error(value):
    """An ``HttpError`` for a wasi:http error code."""
    name = type(value).__name__.replace("ErrorCode_", "")
    detail = getattr(value, "value", None)
    return HttpError(name, detail)


def request(method, url, headers=None, body=None, json=None):
    """Sends one request and reads its response whole.

    ``body`` is bytes or text; ``json`` a value sent as JSON (with its
    content type). Raises ``HttpError`` when the request is refused or fails.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HttpError("HttpRequestUriInvalid", url)
    headers = dict(headers or {})
    if json is not None:
        body = _json.dumps(json)
        headers.setdefault("content-type", "application/json")
    if isinstance(body, str):
        body = body.encode("utf-8")
    fields = wasi.Fields.from_list([(name.lower(), str(value).encode("utf-8")) for name, value in headers.items()])
    outgoing = wasi.OutgoingRequest(fields)
    outgoing.set_method(_METHODS.get(method.upper()) or wasi.Method_Other(method.upper()))
    outgoing.set_scheme(wasi.Scheme_Https() if parts.scheme == "https" else wasi.Scheme_Http())
    outgoing.set_authority(parts.netloc)
    outgoing.set_path_with_query((parts.path or "/") + ("?" + parts.query if parts.query else ""))
    outgoing_body = outgoing.body()
    try:
        pending = outgoing_handler.handle(outgoing, None)
    except Err as error:
        raise _error(error.value)
    # The body is written once the request is handed over, so a large one streams.
    unwritten = None
    with outgoing_body.write() as stream:
        try:
            for start in range(0, len(body or b""), 4096):
                stream.blocking_write_and_flush(body[start:start + 4096])
        except Err as error:
            unwritten = error.value
    if unwritten is None:
        try:
            wasi.OutgoingBody.finish(outgoing_body, None)
        except Err as error:
            unwritten = error
    return _receive(pending, unwritten)


def _receive(pending, unwritten):
    with pending:
        pending.subscribe().block()
        answer = pending.get()
    # An Ok holding an Ok or an Err: the response, or why there is none.
    outcome = answer.value
    if isinstance(outcome, Err):
        raise _error(outcome.value)
    if unwritten is not None:
        raise HttpError("HttpRequestBodySize", "the request body was not taken whole")
    response = outcome.value
    status = response.status()
    headers = {name: value.decode("utf-8", "replace") for name, value in response.headers().entries()}
    incoming = response.consume()
    body = bytearray()
    with incoming.stream() as stream:
        while True:
            try:
                body += stream.blocking_read(_CHUNK)
            except Err as error:
                if isinstance(error.value, streams.StreamError_Closed):
                    break
                raise HttpError("HttpResponseIncomplete", "reading the body after %d bytes" % len(body))
    return Response(status, headers, bytes(body))


def get(url, headers=None):
    """``request("GET", url, headers)``."""
    return request("GET", url, headers=headers)


def post(url, headers=None, body=None, json=None):
    """``request("POST", url, headers, body, json)``."""
    return request("POST", url, headers=headers, body=body, json=json)
