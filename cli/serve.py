"""`edgeseq serve BUNDLE`: an HTTP server for a bundle, with batching across requests; needs
no torch, only the `serve` extra (`pip install 'edgeseq[serve]'`).

    edgeseq serve bundles/g2p-en                                  # 127.0.0.1:8000
    edgeseq serve bundles/g2p-en --host 0.0.0.0 --max-batch 32 --max-wait-ms 5
    edgeseq serve bundles/g2p-en --host 0.0.0.0 --api-key-file /run/secrets/edgeseq-key
    edgeseq serve bundles/nllb --target-lang fra_Latn      # the target unless a request names one
    edgeseq serve bundles/g2p-en --ray --replicas 2 --max-replicas 4   # Ray Serve ('ray' extra)

The routes, status codes and JSON are in docs/serve.md.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import click

from edgeseq.runtime.errors import MissingDependencyError
from edgeseq.runtime.providers import default_provider

from .options import provider_option, threads_option, variant_option

EPILOG = """\b
Routes:
  POST /v1/generate  {"inputs": [...], "options": {"beam_size": 4, ...}}
                     -> {"results": [one `edgeseq generate --json` object per input]}
  GET  /health       200 once loaded and warmed up, else 503
  GET  /v1/model     variant, versions, parity verdict
  GET  /metrics      Prometheus text format
\b
With --api-key-file FILE or EDGESEQ_API_KEY set, every route but /health
(and /metrics, unless --metrics-auth) needs `Authorization: Bearer KEY`;
without it: 401.
\b
Refusals: 413 too many inputs or characters, 422 invalid options or an
over-long input, 429 queue full (Retry-After), 504 past --timeout.
SIGTERM or Ctrl-C: stop accepting, answer the requests in flight, exit.
"""


def _require(module: str, extra: str) -> None:
    try:
        __import__(module)
    except ModuleNotFoundError:
        raise MissingDependencyError(
            f"`edgeseq serve{' --ray' if extra == 'ray' else ''}` needs {module}: "
            f"pip install 'edgeseq[{extra}]'"
        ) from None


@click.command(epilog=EPILOG)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to listen on (0: any free port, printed at start).",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Inputs per engine batch, merged across requests.",
)
@click.option(
    "--max-batch-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Also cap a merged batch's source tokens; step batching: those of the inputs in "
    "flight (default: no cap).",
)
@click.option(
    "--max-wait-ms",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="How long a request waits for others to share its batch.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Inputs waiting at most; beyond: 429.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Threads running the model, one batch each.",
)
@click.option(
    "--max-inputs",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Inputs per request; beyond: 413.",
)
@click.option(
    "--max-chars",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Characters per input; beyond: 413.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a request may wait for its answer; beyond: 504.",
)
@provider_option()
@threads_option()
@variant_option()
@click.option(
    "--target-lang",
    default=None,
    help="A multilingual model's target language for requests that name none (default: the "
    "bundle's, set by export --target-lang); a request's own target_lang wins.",
)
@click.option(
    "--batching",
    type=click.Choice(("auto", "step", "request")),
    default="auto",
    show_default=True,
    help="Greedy requests: step (join the running batch at the next decoder step; needs the "
    "bundle's steps variant), request (whole requests merged); auto: step when the bundle "
    "has it. Beam search and sampling are always batched per request.",
)
@click.option("--access-log", is_flag=True, help="Log every request (uvicorn's access log).")
@click.option(
    "--api-key-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Require its first line as a bearer token on every route but /health "
    "(default: $EDGESEQ_API_KEY; neither: no authentication).",
)
@click.option(
    "--metrics-auth", is_flag=True, help="Put /metrics behind the API key too (default: open)."
)
@click.option("--ray", "use_ray", is_flag=True, help="Serve on Ray Serve instead (ray extra).")
@click.option(
    "--replicas", type=click.IntRange(min=1), default=1, show_default=True, help="Ray replicas."
)
@click.option(
    "--max-replicas",
    type=click.IntRange(min=1),
    default=None,
    help="Ray: autoscale between --replicas and this.",
)
def serve(
    bundle: Path,
    host: str,
    port: int,
    max_batch: int,
    max_batch_tokens: int | None,
    max_wait_ms: float,
    max_queue: int,
    workers: int,
    max_inputs: int,
    max_chars: int,
    timeout_s: float,
    provider: str | None,
    threads: int | None,
    variant: str | None,
    target_lang: str | None,
    batching: str,
    access_log: bool,
    api_key_file: Path | None,
    metrics_auth: bool,
    use_ray: bool,
    replicas: int,
    max_replicas: int | None,
) -> None:
    """Serve the bundle BUNDLE over HTTP: POST /v1/generate, with batching across requests."""
    _require("starlette", "serve")
    _require("uvicorn", "serve")
    from edgeseq.runtime.serve.auth import exposure_warning, read_api_key

    api_key = read_api_key(api_key_file, os.environ)
    if metrics_auth and api_key is None:
        raise click.UsageError("--metrics-auth needs a key: --api-key-file or EDGESEQ_API_KEY")
    warning = exposure_warning(host, api_key)
    if use_ray:
        if max_batch_tokens is not None or workers != 1:
            raise click.UsageError(
                "--max-batch-tokens and --workers apply without --ray (with --ray, each "
                "replica batches requests with Ray's @serve.batch)"
            )
        if metrics_auth:
            raise click.UsageError(
                "--metrics-auth applies without --ray (with --ray there is no /metrics "
                "route: Ray exports its own metrics)"
            )
        if batching == "step":
            raise click.UsageError("--batching step applies without --ray (Ray batches requests)")
        if max_replicas is not None and max_replicas < replicas:
            raise click.UsageError(f"--max-replicas {max_replicas} is below --replicas {replicas}")
        _require("ray", "ray")
        from edgeseq.runtime.serve.ray_run import run_ray

        args = {"bundle": str(bundle.resolve()), "provider": provider or default_provider(),
                "max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_inputs": max_inputs,
                "max_chars": max_chars, "max_queue": max_queue, "replicas": replicas}  # fmt: skip
        if variant is not None:
            args["variant"] = variant
        if threads is not None:
            args["threads"] = threads
        if target_lang is not None:  # refused here, not in each replica
            from edgeseq.runtime.bundle import load_bundle
            from edgeseq.runtime.languages import with_default_target

            with_default_target(load_bundle(bundle).languages, target_lang)
            args["target_lang"] = target_lang
        if max_replicas is not None:
            args["max_replicas"] = max_replicas
        if api_key is not None:
            args["api_key_sha256"] = api_key.sha256  # the replicas get the digest, not the key
        if warning:
            click.echo(warning, err=True)
        run_ray(args, host, port, timeout_s)
        return
    if replicas != 1 or max_replicas is not None:
        raise click.UsageError("--replicas and --max-replicas apply with --ray")

    import uvicorn

    from edgeseq.runtime.generator import Generator
    from edgeseq.runtime.serve.app import create_app
    from edgeseq.runtime.serve.batcher import BatchSettings
    from edgeseq.runtime.serve.request import Limits

    generator = Generator.load(
        bundle, providers=provider, threads=threads, variant=variant, target_lang=target_lang
    )
    variant = generator.variant
    settings = BatchSettings(max_batch, max_batch_tokens, max_wait_ms, max_queue, workers)
    limits = Limits(max_inputs=max_inputs, max_chars=max_chars)
    app = create_app(
        generator, settings, limits, timeout_s, variant, api_key, metrics_auth, batching
    )
    auth = "" if api_key is None else ", API key required"
    click.echo(
        f"serving {bundle} ({variant}, {generator.device}) on http://{host}:{port} "
        f"(max batch {max_batch}, max wait {max_wait_ms:g} ms, {workers} worker(s){auth})",
        err=True,
    )
    if app.state.server.batching == "step":
        line = "greedy requests per decoder step; beam search and sampling per request"
    elif batching == "request":
        line = "per request (--batching request)"
    else:
        line = f"per request (no steps variant for {variant}: export --variants ...,steps)"
    click.echo(f"batching: {line}", err=True)  # once, at start
    if target_lang is not None:
        click.echo(f"target language: {target_lang} unless a request names one", err=True)
    if warning:
        click.echo(warning, err=True)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=access_log,
        log_level="info",
        timeout_graceful_shutdown=int(timeout_s) + 5,
    )
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler it found:
    # make that a no-op so a drained server exits 0 instead of dying by the signal.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    uvicorn.Server(config).run()
    click.echo("stopped: requests in flight answered, queue drained", err=True)
