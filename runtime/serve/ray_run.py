"""Start the Ray Serve deployment of a bundle from `edgeseq serve --ray` and block until
Ctrl-C or SIGTERM, then shut the deployment down.

Connects to a running Ray cluster (`RAY_ADDRESS`, or `ray start --head` on this machine),
else starts a local one for the life of the command.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import click
import ray
from ray import serve

from ..errors import EdgeseqError
from .ray_app import build

APP_NAME = "edgeseq"
PROXY_GRACE_S = 5.0  # Ray's proxy gives up on a request this long after the ingress would


def run_ray(args: dict[str, Any], host: str, port: int, timeout_s: float) -> None:
    """Deploy `build(args)` with Ray's HTTP proxy on host:port (a request gets 504 after
    `timeout_s`); block until SIGINT or SIGTERM."""
    try:  # RAY_ADDRESS, else a head node started on this machine, else a new local cluster
        ray.init(log_to_driver=False)
    except (OSError, ConnectionError, RuntimeError) as exc:
        raise EdgeseqError(f"could not start or join a Ray cluster: {exc}") from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # The ingress answers 504 at timeout_s; the proxy's own timeout (408) is a backstop.
        proxy_timeout_s = timeout_s + PROXY_GRACE_S
        serve.start(http_options={"host": host, "port": port, "request_timeout_s": proxy_timeout_s})
        serve.run(build({**args, "timeout_s": timeout_s}), name=APP_NAME, route_prefix="/")
        click.echo(f"serving {args['bundle']} on Ray Serve at http://{host}:{port}", err=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
