"""``draftwise serve``: an OpenAI-compatible HTTP server (completions, chat, streaming) with live learner metrics."""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import socket
import sys
from typing import Any

from draftwise.cli.generate import add_model_options, check_output_file, load_generator
from draftwise.errors import DraftwiseError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the generator over an OpenAI-compatible HTTP API",
        description="Serve a target, a pool of drafters and a policy over HTTP: POST /v1/completions and "
        "/v1/chat/completions (OpenAI's format, stream true or false), GET /v1/models, /health, /metrics "
        "(Prometheus: vLLM's spec-decode counters and the learner's pulls and values), /v1/learner (JSON) and a "
        "live page at /. Concurrent requests share one batch; the learner keeps what it learns across requests "
        "(and across restarts with --state). Same model options and defaults as 'draftwise generate' (the "
        "embedded zoo). Needs the serve extra: pip install 'draftwise[serve]'.",
    )
    add_model_options(p)
    p.add_argument("--seed", type=int, default=0, help="seed of requests that send none (default 0)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--model-name", default=None,
                   help="the model name clients send and /v1/models lists (default: the --target, zoo:target)")
    p.add_argument("--max-batch", type=int, default=32, help="requests generated together (default 32)")
    p.add_argument("--queue-size", type=int, default=128,
                   help="requests that may wait for a place in the batch; more are answered 503 (default 128)")
    p.add_argument("--state", metavar="FILE",
                   help="keep the learner's state in FILE (JSON): loaded at start if it exists, saved on shutdown")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from draftwise.api import DEFAULT_POLICY, check_seed
    from draftwise.loading import freeze_loaded_objects

    # Everything the user typed is checked before the models load.
    check_seed(args.seed, "--seed")
    if not 0 <= args.port <= 65535:
        raise DraftwiseError(f"--port must lie in [0, 65535], got {args.port}")
    if args.max_batch < 1:
        raise DraftwiseError(f"--max-batch must be ≥ 1, got {args.max_batch}")
    if args.queue_size < 0:
        raise DraftwiseError(f"--queue-size must be ≥ 0, got {args.queue_size}")
    try:
        import uvicorn

        from draftwise.serve.app import Service, create_app
        from draftwise.serve.metrics import ServeMetrics
        from draftwise.serve.scheduler import Scheduler
        from draftwise.serve.state import apply_state, read_state, save_state
    except ModuleNotFoundError as error:
        raise DraftwiseError(f"draftwise serve needs {error.name}: pip install 'draftwise[serve]'") from None
    policy = args.policy or DEFAULT_POLICY
    saved = None
    if args.state:
        check_output_file(args.state, "--state")
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
    service = Service(gen, scheduler, metrics, model=args.model_name or args.target or "zoo:target", policy=policy)
    if args.state:
        state_file = args.state
        service.on_shutdown.append(lambda: save_state(state_file, gen.policy, policy))
    host, port = sock.getsockname()[:2]
    print(f"draftwise serve: http://{host}:{port} (model {service.model}, policy {policy}, arms {', '.join(arms)})",
          file=sys.stderr, flush=True)
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
