"""The Starlette application of `edgeseq serve`.

    app = create_app(generator, BatchSettings(max_batch=32), Limits(), timeout_s=30)
    uvicorn.run(app, host="127.0.0.1", port=8000)

| route | answer |
|---|---|
| `POST /v1/generate` | `{"results": [...]}` (runtime/serve/request.py); errors `{"error": "..."}` |
| `GET /health` | 200 `{"status": "ready"}` once the warm-up ran; 503 `loading` / `draining` |
| `GET /v1/model` | manifest summary: variant, versions, parity verdict |
| `GET /metrics` | Prometheus text format (runtime/serve/metrics.py) |

With an API key (runtime/serve/auth.py) every route but `/health` (and `/metrics`, unless
`metrics_auth`) answers 401 to a request without `Authorization: Bearer <key>`; the refusals
are counted in the metrics like other answers.

The model runs on the batcher's worker threads; the event loop only parses, waits on a
future and answers, so it never blocks on the model. With `batching` "step" (or "auto" and a
bundle with the steps decoder), greedy requests are batched per decoder step
(runtime/serve/continuous.py) and the others per request (runtime/serve/batcher.py).
Status codes: 400 not JSON, 413 too large, 422 invalid, 429 queue full (with
`Retry-After`), 503 not ready or shutting down, 504 timed out. The lifespan's shutdown
(after uvicorn has answered the requests in flight, e.g. on SIGTERM) runs whatever is
still queued and stops the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..generator import Generator
from ..search import GenerationOptions
from .auth import ApiKey, refusal
from .batcher import Batcher, BatchSettings, QueueFullError, RequestTimeoutError, ShuttingDownError
from .continuous import SplitBatcher, StepBatcher, steps_decoder
from .metrics import CONTENT_TYPE, ServeMetrics
from .request import Limits, RequestError, model_summary, parse_generate, render

logger = logging.getLogger("edgeseq.serve")
RETRY_AFTER_S = 1  # what a 429 asks the client to wait
WARM_UP_TEXT = "a"  # any text: symbols outside the vocabulary run as <unk>


class ServerState:
    """What the routes share: the generator, batcher, metrics, settings and readiness."""

    def __init__(
        self,
        generator: Generator,
        settings: BatchSettings,
        limits: Limits,
        timeout_s: float,
        variant: str,
        api_key: ApiKey | None = None,
        metrics_auth: bool = False,
        batching: str = "auto",
    ) -> None:
        self.generator = generator
        self.api_key = api_key
        self.metrics_open = not metrics_auth
        self.limits = limits
        self.timeout_s = timeout_s
        self.variant = variant
        steps = steps_decoder(generator, batching)
        self.batching = "step" if steps is not None else "request"  # what greedy requests get
        requests = Batcher(generator, settings)
        self.step_batcher = StepBatcher(generator, steps, settings) if steps else None
        self.batcher = SplitBatcher(requests, self.step_batcher) if self.step_batcher else requests
        self.metrics = ServeMetrics(lambda: self.batcher.queued_inputs, self.batching)
        self.batcher.on_batch = self.metrics.on_batch
        if self.step_batcher is not None:
            self.step_batcher.on_step = self.metrics.on_step
        self.status = "loading"  # -> "ready" after the warm-up -> "draining" at shutdown


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON error answer: {"error": message}."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def create_app(
    generator: Generator,
    settings: BatchSettings | None = None,
    limits: Limits | None = None,
    timeout_s: float = 30.0,
    variant: str = "fp32",
    api_key: ApiKey | None = None,
    metrics_auth: bool = False,
    batching: str = "auto",
) -> Starlette:
    """The application serving `generator`; the batcher starts and warms up in the
    lifespan, and drains at its end. With `api_key`, requests need it as a bearer token
    (runtime/serve/auth.py); `metrics_auth` puts /metrics behind it too. `batching`: "step",
    "request", or "auto" (step when the bundle has the steps decoder of the variant); the
    mode chosen is `app.state.server.batching`."""
    state = ServerState(
        generator,
        settings or BatchSettings(),
        limits or Limits(),
        timeout_s,
        variant,
        api_key,
        metrics_auth,
        batching,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.batcher.start()
        warmup = asyncio.create_task(_warm_up(state))
        try:
            yield
        finally:
            state.status = "draining"
            warmup.cancel()
            await asyncio.to_thread(state.batcher.close)

    routes = [
        Route("/v1/generate", _measured(state, "generate", _generate), methods=["POST"]),
        Route("/v1/model", _measured(state, "model", _model), methods=["GET"]),
        Route("/health", _measured(state, "health", _health), methods=["GET"]),
        Route("/metrics", _metrics(state), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = state
    return app


async def _warm_up(state: ServerState) -> None:
    """One generation (the first runs allocate), then ready; if it fails, /health says
    why and stays 503."""
    try:
        await asyncio.to_thread(state.generator.generate, [WARM_UP_TEXT], GenerationOptions())
        if state.step_batcher is not None:
            await asyncio.to_thread(state.step_batcher.warm_up, WARM_UP_TEXT)
    except Exception as exc:
        state.status = f"warm-up failed: {type(exc).__name__}: {exc}"
        logger.error("%s", state.status)
        return
    state.status = "ready"


Handler = Callable[[ServerState, Request], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def _measured(state: ServerState, endpoint: str, handler: Handler) -> Endpoint:
    """Wrap a route: refuse it without the API key, time it and count its status in the
    metrics."""

    async def route(request: Request) -> Response:
        started = time.perf_counter()
        response = _refusal(state, request) or await handler(state, request)
        state.metrics.on_request(endpoint, response.status_code, time.perf_counter() - started)
        return response

    return route


def _refusal(state: ServerState, request: Request) -> Response | None:
    authorization = request.headers.get("authorization")
    return refusal(state.api_key, request.url.path, authorization, state.metrics_open)


def _metrics(state: ServerState) -> Endpoint:
    async def route(request: Request) -> Response:
        return _refusal(state, request) or Response(state.metrics.text(), media_type=CONTENT_TYPE)

    return route


async def _health(state: ServerState, request: Request) -> Response:
    code = 200 if state.status == "ready" else 503
    return JSONResponse({"status": state.status}, status_code=code)


async def _model(state: ServerState, request: Request) -> Response:
    return JSONResponse(model_summary(state.generator, state.variant))


async def _generate(state: ServerState, request: Request) -> Response:
    if state.status != "ready":
        return error(503, f"the server is {state.status}; retry when /health answers 200")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > state.limits.max_body_bytes:
        limit = state.limits.max_body_bytes
        return error(413, f"request body has {declared} bytes, at most {limit} allowed")
    try:
        parsed = parse_generate(await request.body(), state.generator, state.limits)
    except RequestError as exc:
        return error(exc.status, str(exc))
    if not parsed.to_run:
        return JSONResponse(render(parsed, [], state.generator))
    try:
        future = state.batcher.submit(
            parsed.texts, parsed.options, state.timeout_s, parsed.source_tokens
        )
    except QueueFullError as exc:
        return error(429, str(exc), {"Retry-After": str(RETRY_AFTER_S)})
    except ShuttingDownError as exc:
        return error(503, str(exc))
    try:
        results = await asyncio.wait_for(asyncio.wrap_future(future), state.timeout_s)
    except (asyncio.TimeoutError, RequestTimeoutError):
        return error(504, f"no answer within {state.timeout_s:g} s; the server is overloaded")
    except Exception as exc:  # the model failed on this request alone
        logger.exception("generation failed")
        return error(500, f"generation failed: {type(exc).__name__}: {exc}")
    body = json.dumps(render(parsed, results, state.generator), ensure_ascii=False)
    return Response(body, media_type="application/json")
