"""``draftwise serve``: an OpenAI-compatible HTTP server (completions, chat, streaming) with live learner metrics."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import os
import signal
import socket
import sys
from typing import Any
from urllib.parse import urlsplit

from draftwise.cli.generate import add_model_options, check_output_file, load_generator
from draftwise.errors import DraftwiseError
from draftwise.models.defaults import DEFAULT_TARGET
from draftwise.request import check_seed
from draftwise.serve.security import Access


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the generator over an OpenAI-compatible HTTP API",
        description="Serve a target, a pool of drafters and a policy over HTTP: POST /v1/completions and "
        "/v1/chat/completions (OpenAI's format, stream true or false), GET /v1/models, /health, /metrics "
        "(Prometheus: vLLM's spec-decode counters and the learner's pulls and values), /v1/learner (JSON) and a "
        "live page at /. Concurrent requests share one batch; the learner keeps what it learns across requests "
        "(and across restarts with --state). Same model options and defaults as 'draftwise generate' (SmolLM2 "
        "and its drafters, fetched once). Needs the serve extra: pip install 'draftwise[serve]'.",
    )
    add_model_options(p)
    p.add_argument("--seed", type=int, default=None,
                   help="seed of requests that send none (default: a fresh one per request, returned in the "
                   "response as \"seed\")")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface, "
                   "then set --api-key)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--model-name", default=None,
                   help="the model name clients send and /v1/models lists (default: the --target, smollm2)")
    p.add_argument("--max-batch", type=int, default=32, help="requests generated together (default 32)")
    p.add_argument("--queue-size", type=int, default=128,
                   help="requests that may wait for a place in the batch; more are answered 503 (default 128)")
    p.add_argument("--state", metavar="FILE",
                   help="keep the learner's state in FILE (JSON): loaded at start if it exists, saved on shutdown")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every /v1/ route (/health, /metrics and the page "
                   f"stay open); default: ${API_KEY_ENV}, else no key")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header names NAME (repeatable; * for any). Default: "
                   "localhost names, the --host address, and any address when listening on 0.0.0.0 or ::")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages at ORIGIN (scheme://host[:port]; * for any) call the server from a browser "
                   "(repeatable; default: none, and requests from other sites' pages are refused)")
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_MB,
                   help=f"largest request body in MiB; larger ones get 413 (default {DEFAULT_MAX_BODY_MB:g})")
    p.set_defaults(func=run)


API_KEY_ENV = "DRAFTWISE_API_KEY"
DEFAULT_MAX_BODY_MB = 4.0


def check_access_options(args: argparse.Namespace) -> Any:
    """The :class:`~draftwise.serve.security.Access` the options ask for (the key from the environment when
    not given); one clear error for a value that cannot work."""
    key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    source = "--api-key" if args.api_key is not None else f"${API_KEY_ENV}"
    if key is not None and (not key.strip() or any(c.isspace() for c in key) or not key.isprintable()):
        raise DraftwiseError(f"{source} must be a non-empty key without spaces, got {key!r}")
    for origin in args.cors_origin:
        parts = urlsplit(origin)
        if origin != "*" and (parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/")):
            raise DraftwiseError(f"--cors-origin {origin!r} is not an origin; pass scheme://host[:port] such as "
                                 "http://localhost:3000, or *")
    for name in args.allowed_host:
        if not name.strip() or "/" in name:
            raise DraftwiseError(f"--allowed-host {name!r} is not a host name; pass a name such as my-server.lan, "
                                 "or *")
    return Access(bound_host=args.host, allowed_hosts=tuple(args.allowed_host), cors_origins=tuple(args.cors_origin),
                  api_key=key)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(args: argparse.Namespace) -> int:
    # the server needs the serve extra (Starlette, uvicorn) and the engine (torch): loaded to serve only
    from draftwise.api import DEFAULT_POLICY
    from draftwise.models.loading import freeze_loaded_objects

    # Everything the user typed is checked before the models load.
    if args.seed is not None:
        check_seed(args.seed, "--seed")
    if not args.max_body_mb > 0:
        raise DraftwiseError(f"--max-body-mb must be > 0, got {args.max_body_mb}")
    access = check_access_options(args)
    if not 0 <= args.port <= 65535:
        raise DraftwiseError(f"--port must lie in [0, 65535], got {args.port}")
    if args.max_batch < 1:
        raise DraftwiseError(f"--max-batch must be ≥ 1, got {args.max_batch}")
    if args.queue_size < 0:
        raise DraftwiseError(f"--queue-size must be ≥ 0, got {args.queue_size}")
    try:  # the serve extra (Starlette, uvicorn) is optional
        import uvicorn

        from draftwise.serve.app import ServeSettings, Service, create_app
        from draftwise.serve.metrics import ServeMetrics
        from draftwise.serve.scheduler import Scheduler
        from draftwise.serve.state import apply_state, read_state, save_state
    except ModuleNotFoundError as error:
        raise DraftwiseError(f"draftwise serve needs {error.name}: pip install 'draftwise[serve]'") from None
    policy = args.policy or DEFAULT_POLICY
    saved = None
    if args.state:
        check_output_file(args.state, "--state", "state.json")
        saved = read_state(args.state, policy)  # a damaged file is refused before the models load
    sock = _bind(args.host, args.port)  # before loading: a port in use is a clear error, not a late crash

    gen = load_generator(args)
    freeze_loaded_objects()  # full garbage collections would walk the models while requests wait
    if saved is not None:
        apply_state(saved, gen.policy)
        logging.getLogger(__name__).info("learner state loaded from %s", args.state)
    arms = [arm.name for arm in gen.arms]
    metrics = ServeMetrics(arms, policy)
    metrics.observe_learner(gen.policy)

    def on_result(result: Any) -> None:
        metrics.observe(result)
        metrics.observe_learner(gen.policy)

    scheduler = Scheduler(gen, max_batch=args.max_batch, queue_size=args.queue_size, on_result=on_result,
                          on_cancel=metrics.cancelled.inc)
    settings = ServeSettings(access=access, max_body_bytes=int(args.max_body_mb * 2**20), seed=args.seed)
    service = Service(gen, scheduler, metrics, model=args.model_name or args.target or DEFAULT_TARGET, policy=policy,
                      settings=settings)
    if args.state:
        state_file = args.state
        service.on_shutdown.append(lambda: save_state(state_file, gen.policy, policy))
    host, port = sock.getsockname()[:2]
    print(f"draftwise serve: http://{host}:{port} (model {service.model}, policy {policy}, arms {', '.join(arms)})",
          file=sys.stderr, flush=True)
    if access.api_key is None and not _is_loopback(args.host):
        print(f"draftwise serve: warning: listening on {args.host} without an API key: anyone who can reach this "
              f"port can generate; set --api-key or ${API_KEY_ENV}", file=sys.stderr, flush=True)
    config = uvicorn.Config(create_app(service), log_level="info" if args.verbose else "warning",
                            timeout_graceful_shutdown=None)
    # uvicorn finishes in-flight requests on SIGTERM, then raises the signal again: exit 0 rather than be killed.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        why = "is already in use" if error.errno == errno.EADDRINUSE else f"cannot be bound ({error.strerror})"
        raise DraftwiseError(f"{host}:{port} {why}; pick another --port or --host") from None
    except UnicodeError:
        sock.close()
        raise DraftwiseError(f"--host {host!r} is not a valid address") from None
    sock.set_inheritable(True)
    return sock
