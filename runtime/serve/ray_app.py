"""A bundle as a Ray Serve application: the same request contract as `edgeseq serve`
(runtime/serve/request.py), with Ray's request batching, replicas and autoscaling.

    edgeseq serve bundles/g2p-en --ray --replicas 2           # local Ray, blocks until Ctrl-C
    serve run edgeseq.runtime.serve.ray_app:build bundle=/srv/bundles/g2p-en
    serve run serve.yaml                                      # see docs/serve.md

Two deployments: `EdgeseqIngress` takes the HTTP requests from Ray's proxy (the API key, the
routes, `timeout_s`) and hands each to an `EdgeseqDeployment` replica, a loaded Generator.
The ingress runs no model, so a model replica that dies (killed, out of memory, a crash in
onnxruntime) cannot take the answer with it: its requests in flight get 503 with
`Retry-After` instead of the 500 that Ray's proxy would send, the others go to the live
replicas, and Ray starts a replacement. A request is not re-run by the server: one that
crashed a replica could crash the next (the client decides; docs/serve.md).

Routes: `POST /v1/generate`, `GET /v1/model`, `GET /health` (Ray Serve's own proxy answers
`/-/healthz`; Prometheus metrics are Ray's own, e.g. `serve_actual_batch_size`). With a key
(`api_key_file=PATH`, or `$EDGESEQ_API_KEY` where the application is built), every route but
`/health` needs it as a bearer token, as for `edgeseq serve` (runtime/serve/auth.py); the
ingress receives its sha256 only (`api_key_sha256`), which is what Ray stores.
Status codes as `edgeseq serve`: 429 (`Retry-After`) when `max_queue` requests already wait
for a replica, 503 (`Retry-After`) when a replica died before answering, 504 past
`timeout_s`.

`@serve.batch` merges concurrent requests of one replica (up to `max_batch` requests, waiting
at most `max_wait_ms`); `run_merged` then runs each group of equal options as one
`Generator.generate` call on a worker thread, exactly as the single-machine batcher does, so
results equal offline generation. Needs the `ray` extra: `pip install 'edgeseq[ray]'`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import BackpressureConfig
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..generator import Generator, Result
from ..search import GenerationOptions
from .auth import ApiKey, api_key_digest, refusal
from .batcher import run_merged
from .request import Limits, RequestError, model_summary, parse_generate, render

logger = logging.getLogger("edgeseq.serve")

# `build` arguments (strings from `serve run ... key=value` or serve.yaml) and their types.
ARGS: dict[str, type] = {
    "bundle": str,
    "variant": str,
    "provider": str,
    "threads": int,
    "max_batch": int,
    "max_wait_ms": float,
    "max_inputs": int,
    "max_chars": int,
    "max_queue": int,
    "replicas": int,
    "max_replicas": int,
    "timeout_s": float,
    "api_key_file": str,
    "api_key_sha256": str,
    "target_lang": str,
}
RETRY_AFTER_S = 1  # what a 429 or 503 asks the client to wait, as edgeseq serve's 429
ROUTES = (("POST", "/v1/generate"), ("GET", "/v1/model"), ("GET", "/health"))
# What a model replica that died before answering raises in the ingress.
REPLICA_LOST = (RayActorError, ReplicaUnavailableError, DeploymentUnavailableError)
Answer = tuple[int, dict[str, Any]]  # HTTP status, JSON body


def route_of(method: str, path: str) -> str | None:
    """The route ("/v1/generate", ...) that `method path` asks for, under any route prefix."""
    path = path.rstrip("/")
    return next((r for m, r in ROUTES if m == method and path.endswith(r)), None)


def error(status: int, message: str, retry: bool = False) -> JSONResponse:
    """{"error": message}; with `retry`, a `Retry-After` header."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


@serve.deployment(max_ongoing_requests=64)
class EdgeseqDeployment:
    """One model replica: a loaded Generator answering the routes' bodies."""

    def __init__(
        self,
        bundle: str,
        variant: str | None = None,
        provider: str = "cpu",
        threads: int | None = 1,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        limits: Limits | None = None,
        target_lang: str | None = None,
    ) -> None:
        self.generator = Generator.load(
            bundle, providers=provider, threads=threads, variant=variant, target_lang=target_lang
        )
        self.variant = self.generator.variant
        self.max_batch = max_batch
        self.limits = limits or Limits()
        self.generator.generate(["a"])  # warm-up before the replica reports healthy
        self._run.set_max_batch_size(max_batch)
        self._run.set_batch_wait_timeout_s(max_wait_ms / 1000)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _run(
        self, requests: list[tuple[list[str], GenerationOptions]]
    ) -> list[list[Result] | Exception]:
        return await asyncio.to_thread(run_merged, self.generator, requests, self.max_batch)

    async def answer(self, route: str, body: bytes) -> Answer:
        """The status and JSON body for one request to `route` (one of ROUTES)."""
        if route == "/health":
            return 200, {"status": "ready"}
        if route == "/v1/model":
            return 200, model_summary(self.generator, self.variant)
        try:
            parsed = parse_generate(body, self.generator, self.limits)
        except RequestError as exc:
            return exc.status, {"error": str(exc)}
        results: list[Result] | Exception = []
        if parsed.to_run:
            results = await self._run((parsed.texts, parsed.options))
        if isinstance(results, Exception):
            return 500, {"error": f"generation failed: {type(results).__name__}: {results}"}
        return 200, render(parsed, results, self.generator)


@serve.deployment(ray_actor_options={"num_cpus": 0})
class EdgeseqIngress:
    """The HTTP side: the API key, the routes and the timeout; the model replicas answer."""

    def __init__(
        self, model: DeploymentHandle, timeout_s: float = 30.0, api_key_sha256: str | None = None
    ) -> None:
        self.model = model
        self.timeout_s = timeout_s
        self.api_key = ApiKey(api_key_sha256) if api_key_sha256 else None

    async def __call__(self, request: Request) -> Response:
        """Route one HTTP request."""
        path, method = request.url.path, request.method
        route = route_of(method, path)
        denied = refusal(self.api_key, route or path, request.headers.get("authorization"))
        if denied is not None:
            return denied
        if route is None:
            return error(404, f"no route {method} {path}")
        body = await request.body() if method == "POST" else b""
        response = self.model.answer.remote(route, body)
        try:
            status, payload = await asyncio.wait_for(_result(response), self.timeout_s)
        except asyncio.TimeoutError:
            response.cancel()
            return error(504, f"no answer within {self.timeout_s:g} s; the server is overloaded")
        except BackPressureError as exc:
            return error(429, str(exc), retry=True)
        except REPLICA_LOST as exc:
            logger.warning("a replica was lost with a request: %s", type(exc).__name__)
            message = "the replica running this request stopped; retry after Retry-After"
            return error(503, message, retry=True)
        except Exception as exc:  # a fault in the replica's code: a JSON 500, not Ray's text
            logger.exception("the replica failed")
            return error(500, f"the replica failed: {type(exc).__name__}")
        return JSONResponse(payload, status_code=status)


async def _result(response: Any) -> Answer:
    return await response


def build(args: dict[str, Any]) -> serve.Application:
    """The application for `serve run edgeseq.runtime.serve.ray_app:build bundle=DIR ...`
    (values may be strings); `replicas` fixed, or autoscaling from it to `max_replicas`."""
    unknown = sorted(set(args) - set(ARGS))
    if unknown or "bundle" not in args:
        raise ValueError(f"build() takes bundle= and optionally {sorted(ARGS)}; got {unknown}")
    values = {k: ARGS[k](v) for k, v in args.items()}
    digest = api_key_digest(
        values.pop("api_key_sha256", None), values.pop("api_key_file", None), os.environ
    )
    timeout_s = values.pop("timeout_s", 30.0)
    replicas = values.pop("replicas", 1)
    max_replicas = values.pop("max_replicas", None)
    max_queue = values.pop("max_queue", 1024)
    ongoing = 2 * values.get("max_batch", 32)  # per replica: a batch running, one forming
    limits = Limits(
        max_inputs=values.pop("max_inputs", Limits.max_inputs),
        max_chars=values.pop("max_chars", Limits.max_chars),
    )
    # Requests waiting for a model replica beyond max_queue: 429 with Retry-After, as
    # edgeseq serve (BackPressureError in the ingress); the same bound at Ray's proxy.
    backpressure = {
        "max_queued_requests": max_queue,
        "backpressure_config": BackpressureConfig(status_code=429, retry_after_s=RETRY_AFTER_S),
    }
    if max_replicas is not None and max_replicas > replicas:
        autoscaling = {
            "min_replicas": replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": ongoing,
        }
        model = EdgeseqDeployment.options(
            autoscaling_config=autoscaling, max_ongoing_requests=ongoing, **backpressure
        )
    else:
        model = EdgeseqDeployment.options(
            num_replicas=replicas, max_ongoing_requests=ongoing, **backpressure
        )
    # An ingress replica holds what its model replicas run plus what waits for them.
    ingress = EdgeseqIngress.options(
        num_replicas=replicas,
        max_ongoing_requests=ongoing * max(replicas, max_replicas or 1) + max_queue,
        **backpressure,
    )
    return ingress.bind(
        model.bind(limits=limits, **values), timeout_s=timeout_s, api_key_sha256=digest
    )
