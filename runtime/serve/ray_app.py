"""A bundle as a Ray Serve deployment: the same request contract as `edgeseq serve`
(runtime/serve/request.py), with Ray's request batching, replicas and autoscaling.

    edgeseq serve bundles/g2p-en --ray --replicas 2           # local Ray, blocks until Ctrl-C
    serve run edgeseq.runtime.serve.ray_app:build bundle=/srv/bundles/g2p-en
    serve run serve.yaml                                      # see docs/serve.md

Routes: `POST /v1/generate`, `GET /v1/model`, `GET /health` (Ray Serve's own proxy answers
`/-/healthz`; Prometheus metrics are Ray's own, e.g. `serve_actual_batch_size`). With a key
(`api_key_file=PATH`, or `$EDGESEQ_API_KEY` where the application is built), every route but
`/health` needs it as a bearer token, as for `edgeseq serve` (runtime/serve/auth.py); the
replicas receive its sha256 only (`api_key_sha256`), which is what Ray stores.

`@serve.batch` merges concurrent requests of one replica (up to `max_batch` requests, waiting
at most `max_wait_ms`); `run_merged` then runs each group of equal options as one
`Generator.generate` call on a worker thread, exactly as the single-machine batcher does, so
results equal offline generation. Needs the `ray` extra: `pip install 'edgeseq[ray]'`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ray import serve
from ray.serve.config import BackpressureConfig
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..generator import Generator, Result
from ..search import GenerationOptions
from .auth import ApiKey, api_key_digest, refusal
from .batcher import run_merged
from .request import Limits, RequestError, model_summary, parse_generate, render

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
    "api_key_file": str,
    "api_key_sha256": str,
}


@serve.deployment(max_ongoing_requests=64)
class EdgeseqDeployment:
    """One replica: a loaded Generator answering the /v1/generate contract."""

    def __init__(
        self,
        bundle: str,
        variant: str | None = None,
        provider: str = "cpu",
        threads: int | None = 1,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        limits: Limits | None = None,
        api_key_sha256: str | None = None,
    ) -> None:
        self.generator = Generator.load(
            bundle, providers=provider, threads=threads, variant=variant
        )
        self.variant = self.generator.variant
        self.max_batch = max_batch
        self.limits = limits or Limits()
        self.api_key = ApiKey(api_key_sha256) if api_key_sha256 else None
        self.generator.generate(["a"])  # warm-up before the replica reports healthy
        self._run.set_max_batch_size(max_batch)
        self._run.set_batch_wait_timeout_s(max_wait_ms / 1000)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _run(
        self, requests: list[tuple[list[str], GenerationOptions]]
    ) -> list[list[Result] | Exception]:
        return await asyncio.to_thread(run_merged, self.generator, requests, self.max_batch)

    async def __call__(self, request: Request) -> Response:
        """Route one HTTP request."""
        path, method = request.url.path.rstrip("/"), request.method
        denied = refusal(self.api_key, path, request.headers.get("authorization"))
        if denied is not None:
            return denied
        if path.endswith("/health") and method == "GET":
            return JSONResponse({"status": "ready"})
        if path.endswith("/v1/model") and method == "GET":
            return JSONResponse(model_summary(self.generator, self.variant))
        if not (path.endswith("/v1/generate") and method == "POST"):
            return JSONResponse({"error": f"no route {method} {path}"}, status_code=404)
        try:
            parsed = parse_generate(await request.body(), self.generator, self.limits)
        except RequestError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        results: list[Result] | Exception = []
        if parsed.to_run:
            results = await self._run((parsed.texts, parsed.options))
        if isinstance(results, Exception):
            message = f"generation failed: {type(results).__name__}: {results}"
            return JSONResponse({"error": message}, status_code=500)
        return JSONResponse(render(parsed, results, self.generator))


def build(args: dict[str, Any]) -> serve.Application:
    """The application for `serve run edgeseq.runtime.serve.ray_app:build bundle=DIR ...`
    (values may be strings); `replicas` fixed, or autoscaling from it to `max_replicas`."""
    unknown = sorted(set(args) - set(ARGS))
    if unknown or "bundle" not in args:
        raise ValueError(f"build() takes bundle= and optionally {sorted(ARGS)}; got {unknown}")
    values = {k: ARGS[k](v) for k, v in args.items()}
    values["api_key_sha256"] = api_key_digest(
        values.pop("api_key_sha256", None), values.pop("api_key_file", None), os.environ
    )
    replicas = values.pop("replicas", 1)
    # Requests queued at each Ray proxy beyond max_queue: 429 with Retry-After, as edgeseq serve.
    backpressure = {
        "max_ongoing_requests": 2 * values.get("max_batch", 32),  # a batch running, one forming
        "max_queued_requests": values.pop("max_queue", 1024),
        "backpressure_config": BackpressureConfig(status_code=429, retry_after_s=1),
    }
    max_replicas = values.pop("max_replicas", None)
    limits = Limits(
        max_inputs=values.pop("max_inputs", Limits.max_inputs),
        max_chars=values.pop("max_chars", Limits.max_chars),
    )
    if max_replicas is not None and max_replicas > replicas:
        autoscaling = {
            "min_replicas": replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": 2 * values.get("max_batch", 32),
        }
        deployment = EdgeseqDeployment.options(autoscaling_config=autoscaling, **backpressure)
    else:
        deployment = EdgeseqDeployment.options(num_replicas=replicas, **backpressure)
    return deployment.bind(limits=limits, **values)
