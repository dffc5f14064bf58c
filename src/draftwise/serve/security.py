"""Who may use the server: the ``Host`` and ``Origin`` a request comes with, and its API key.

* ``Host`` — a browser sends the name it resolved: a page of another site whose name was made to resolve
  to this machine (DNS rebinding) arrives with that name and is refused. Accepted: localhost names
  (``localhost``, ``*.localhost``, loopback addresses), the address the server is bound to, names passed
  with ``--allowed-host`` (``*``: any), and, when bound to every interface (``0.0.0.0``, ``::``), any IP
  address (an address cannot be rebound).
* ``Origin`` — a browser names the page that sent a request: a page of another site is refused, whatever
  its request (a ``text/plain`` POST needs no CORS preflight), unless ``--cors-origin`` allows it.
* ``Authorization: Bearer KEY`` — with an API key, every ``/v1/`` route needs it (as vLLM); ``/health``,
  ``/metrics`` and the live page do not.

Errors are OpenAI-shaped JSON, as every other answer of the server.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
PROTECTED_PREFIX = "/v1/"


@dataclass(frozen=True)
class Access:
    """Who may call the server (see the module docstring)."""

    bound_host: str = "127.0.0.1"  # the address the server listens on
    allowed_hosts: tuple[str, ...] = ()  # more names for the Host header; "*" accepts any
    cors_origins: tuple[str, ...] = ()  # web pages (scheme://host[:port]) allowed to call; "*" any
    api_key: str | None = None  # required as a bearer token on /v1/ routes


def host_name(header: str) -> str:
    """The name in a ``Host`` header, lower-case, without port or brackets.

    >>> host_name("LocalHost:8000"), host_name("[::1]:8000"), host_name("example.com.")
    ('localhost', '::1', 'example.com')
    """
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        header = header.split(":", 1)[0]
    return header.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(name: str, access: Access) -> bool:
    """Whether a request may name ``name`` (from :func:`host_name`) as its host.

    >>> host_allowed("localhost", Access()), host_allowed("attacker.example", Access())
    (True, False)
    >>> host_allowed("192.168.1.5", Access(bound_host="0.0.0.0")), host_allowed("192.168.1.5", Access())
    (True, False)
    """
    if not name:
        return False
    if name in LOCAL_NAMES or name.endswith(".localhost") or name == host_name(access.bound_host):
        return True
    if "*" in access.allowed_hosts or name in {host_name(h) for h in access.allowed_hosts}:
        return True
    # an address cannot be rebound: any of this machine's is fine when the server listens on all of them
    return _is_ip(name) and (ipaddress.ip_address(name).is_loopback or access.bound_host in WILDCARD_HOSTS)


def origin_allowed(origin: str, access: Access) -> bool:
    """Whether a page at ``origin`` (an ``Origin`` header) may call the server: one of the allowed hosts'
    own pages, or an origin passed with ``--cors-origin``.

    >>> origin_allowed("http://localhost:8000", Access()), origin_allowed("https://evil.example", Access())
    (True, False)
    >>> origin_allowed("null", Access())
    False
    """
    if "*" in access.cors_origins or origin.rstrip("/") in {o.rstrip("/") for o in access.cors_origins}:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and host_allowed((parts.hostname or "").rstrip("."), access)


def bearer_matches(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``key`` as a bearer token (compared in constant time)."""
    if not header:
        return False
    scheme, _, token = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def refusal(scope: Scope, access: Access) -> tuple[int, str, str, dict[str, str]] | None:
    """Why this HTTP request is refused — (status, message, code, headers) — or None when it may go on."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    host = headers.get("host", "")
    if not host_allowed(host_name(host), access):
        shown = host or "(none)"
        return (400, f"the Host header {shown!r} is not one this server answers to (localhost, "
                     f"{access.bound_host}); start it with --allowed-host NAME to accept that name", "invalid_host", {})
    origin = headers.get("origin")
    if origin is not None and not origin_allowed(origin, access):
        return (403, f"requests from web pages at {origin!r} are not allowed; start the server with --cors-origin "
                     f"{origin} to allow them", "origin_not_allowed", {})
    path = scope.get("path", "")
    if (access.api_key is not None and (path + "/").startswith(PROTECTED_PREFIX) and scope.get("method") != "OPTIONS"
            and not bearer_matches(headers.get("authorization"), access.api_key)):
        given = "a wrong API key" if headers.get("authorization") else "no API key"
        return (401, f"{given}: send this server's key as 'Authorization: Bearer KEY' (the openai client's "
                     "api_key)", "invalid_api_key", {"WWW-Authenticate": "Bearer"})
    return None


class Guard:
    """ASGI middleware: refuses requests that :func:`refusal` refuses, before any route runs."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = refusal(scope, self.access)
            if refused is not None:
                status, message, code, headers = refused
                body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                             "code": code}}).encode()
                await send({"type": "http.response.start", "status": status, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    *((k.lower().encode(), v.encode()) for k, v in headers.items())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
