"""`edgeseq serve` (issue 28): the real server (uvicorn on an ephemeral loopback port) against
the tiny trained bundle: concurrent requests equal offline generation, overload is refused
with 429 and loses nothing, bad requests get their status and message, /metrics parses,
SIGTERM drains."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from prometheus_client.parser import text_string_to_metric_families
from serve_client import (
    EDGESEQ,
    HeldRequest,
    assert_same_json,
    generate,
    read_until,
    request,
    running,
    wait_ready,
)

from edgeseq.runtime.generator import Generator
from edgeseq.runtime.results import result_json
from edgeseq.runtime.search import GenerationOptions
from edgeseq.runtime.serve.app import create_app
from edgeseq.runtime.serve.batcher import BatchSettings
from edgeseq.runtime.serve.request import Limits

WORDS = ["abc", "jihg", "a", "bbbbcc", "cafe", "hij", "dcba", "efghij", "ab", "gij", "fed"]
OPTIONS = [
    {},
    {"beam_size": 3, "n_best": 2},
    {"sample": True, "seed": 7, "top_k": 4},
    {"max_new_tokens": 3},
]


@pytest.fixture(scope="module")
def generator(runtime_case) -> Generator:
    return Generator.load(runtime_case.bundle, providers="cpu", threads=1)


def offline(generator: Generator, inputs: list[str], options: dict) -> list[dict]:
    """What `edgeseq generate --json` gives for these inputs (empty ones skipped)."""
    opts = GenerationOptions(**options)
    todo = [t for t in inputs if t]
    results = iter(generator.generate(todo, opts)) if todo else iter(())
    target = generator.tokenizers.target
    return [
        result_json(i, t, next(results) if t else None, target)
        for i, t in enumerate(inputs, start=1)
    ]


def metric_samples(port: int) -> dict[str, float]:
    """{"name{labels}": value} of every sample at /metrics (parsed by prometheus_client)."""
    status, headers, text = request(port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """{"name{labels}": value} of every sample in a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


CLIENTS = 16  # threads sending requests at once


def test_concurrent_requests_equal_offline_and_share_batches(generator) -> None:
    """The queue is held until the first CLIENTS requests wait in it (4 of each option set),
    so whatever the timing the workers find requests to merge."""
    cases = [
        (WORDS[i % len(WORDS) : i % len(WORDS) + 1 + i % 3] + ([""] if i % 5 == 0 else []),
         OPTIONS[i % len(OPTIONS)])
        for i in range(40)
    ]  # fmt: skip
    app = create_app(generator, BatchSettings(max_batch=8, max_wait_ms=50, workers=2))
    queue = app.state.server.batcher.queue
    queue.hold()
    with running(app) as port, ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(generate, port, *case) for case in cases]
        queue.wait(time.monotonic() + 60, lambda jobs: len(jobs) >= CLIENTS)
        first = sum(1 for inputs, _ in cases[:CLIENTS] for t in inputs if t)
        assert queue.queued_inputs == first  # the first CLIENTS requests, nothing run
        queue.release()
        answers = [future.result() for future in futures]
        samples = metric_samples(port)
    for (inputs, options), (status, body) in zip(cases, answers, strict=True):
        assert status == 200, body
        assert_same_json(body["results"], offline(generator, inputs, options))
    engine_calls = samples["edgeseq_batch_size_count{}"]
    run_inputs = sum(1 for inputs, _ in cases for t in inputs if t)
    assert samples["edgeseq_inputs_total{}"] == run_inputs
    assert engine_calls < len(cases), "no two requests were merged into one batch"
    assert samples["edgeseq_requests_total{endpoint=generate,status=200}"] == len(cases)


def test_overload_is_refused_with_429_and_nothing_is_lost(generator) -> None:
    """The queue is held while 30 one-input requests arrive: the first 3 fill it and the 27
    others are refused; once they are, the queue is released and the 3 are answered."""
    settings = BatchSettings(max_batch=2, max_wait_ms=100, max_queue=3)
    words = [WORDS[i % len(WORDS)] for i in range(30)]
    app = create_app(generator, settings)
    queue = app.state.server.batcher.queue
    queue.hold()
    with running(app) as port, ThreadPoolExecutor(30) as pool:
        futures = [
            pool.submit(request, port, "POST", "/v1/generate", {"inputs": [w]}) for w in words
        ]
        refused = list(itertools.islice(as_completed(futures, timeout=60), 27))
        assert [f.result()[0] for f in refused] == [429] * 27 and queue.queued_inputs == 3
        queue.release()
        answers = [future.result() for future in futures]
        samples = metric_samples(port)
    statuses = [status for status, _, _ in answers]
    assert statuses.count(200) == 3 and statuses.count(429) == 27, statuses
    for word, (status, headers, body) in zip(words, answers, strict=True):
        if status == 429:
            assert headers["retry-after"] == "1"
            assert re.search(r"queue is full \(3 inputs waiting, at most 3\)", body["error"])
        else:
            assert_same_json(body["results"], offline(generator, [word], {}))
    answered = sum(
        v for k, v in samples.items() if k.startswith("edgeseq_requests_total{endpoint=generate")
    )
    assert answered == 30


BAD_REQUESTS = [
    (b"{not json", 400, r"not valid JSON"),
    (b'["abc"]', 422, r"must be a JSON object"),
    (b'{"inputs": "abc"}', 422, r'"inputs" must be a list of strings'),
    (b'{"inputs": ["abc", 3]}', 422, r'"inputs" must be a list of strings'),
    (b'{"inputs": ["abc"], "beam": 4}', 422, r"unknown fields \['beam'\]"),
    (b'{"inputs": ["abc"], "options": {"beam": 4}}', 422, r"unknown options \['beam'\]; known"),
    (b'{"inputs": ["abc"], "options": {"batch_size": 4}}', 422, r"unknown options"),
    (b'{"inputs": ["abc"], "options": {"n_best": 3}}', 422, r"n_best \(3\) cannot exceed"),
    (b'{"inputs": ["abc"], "options": {"sample": "yes"}}', 422, r'"sample" must be true or false'),
    (b'{"inputs": ["abc"], "options": {"top_p": 2}}', 422, r"top_p must be in \(0, 1\]"),
    (json.dumps({"inputs": ["a"] * 5}).encode(), 413, r"5 inputs in one request, at most 4"),
    (json.dumps({"inputs": ["ab", "a" * 41]}).encode(), 413, r"input 2 has 41 characters, at most"),
    (json.dumps({"inputs": ["ab", "a" * 30]}).encode(), 422,
     r'input 2 has 31 source tokens.*max_len is 20.*"truncate": true'),
    (b" " * 5000, 413, r"request body has 5000 bytes, at most 4096"),
]  # fmt: skip


def test_bad_requests_get_their_status_and_message_and_spare_the_others(generator) -> None:
    limits = Limits(max_inputs=4, max_chars=40, max_body_bytes=4096)
    app = create_app(generator, BatchSettings(max_wait_ms=30), limits)
    good = [(["cafe", "ab"], {}), (["hij"], {"beam_size": 2})] * 4
    with running(app) as port, ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(generate, port, *case) for case in good]
        bads = [
            pool.submit(request, port, "POST", "/v1/generate", None, raw)
            for raw, _, _ in BAD_REQUESTS
        ]
        for (_, status, pattern), future in zip(BAD_REQUESTS, bads, strict=True):
            got, _, body = future.result()
            assert got == status and set(body) == {"error"}, (pattern, body)
            assert re.search(pattern, body["error"]), body["error"]
        for (inputs, options), future in zip(good, goods, strict=True):
            status, body = future.result()
            assert status == 200
            assert_same_json(body, {"results": offline(generator, inputs, options)})
        assert request(port, "GET", "/v1/generate")[0] == 405
        # over-long input with truncate: cut, flagged, and equal to offline
        long = ["abcdefghij" * 3]
        status, body = generate(port, long, {"truncate": True})
        assert status == 200 and body["results"][0]["truncated"] is True
        assert_same_json(body["results"], offline(generator, long, {"truncate": True}))


def test_health_model_and_metrics(generator, runtime_case) -> None:
    with running(create_app(generator)) as port:
        assert request(port, "GET", "/health")[::2] == (200, {"status": "ready"})
        status, _, model = request(port, "GET", "/v1/model")
        assert generate(port, ["", ""]) == (200, {"results": offline(generator, ["", ""], {})})
        samples = metric_samples(port)
    assert status == 200
    assert model["variant"] == "fp32" and model["bundle"] == runtime_case.bundle.name
    assert model["edgeseq_version"] and model["max_len"] == generator.config.max_len
    assert set(model["parity"]) == {"passed", "verified"}
    for name in ("edgeseq_queue_depth{}", "edgeseq_generated_tokens_total{}",
                 "edgeseq_batch_seconds_count{}", "edgeseq_request_seconds_count{endpoint=health}",
                 'edgeseq_batch_size_bucket{le=+Inf}'):  # fmt: skip
        assert name in samples, sorted(samples)
    assert samples["edgeseq_queue_depth{}"] == 0
    assert samples["edgeseq_inputs_total{}"] == 0  # empty inputs are not run


def test_a_request_past_its_timeout_gets_504_and_is_not_run(generator) -> None:
    """The queue is held past the request's timeout, so no worker can run it before the 504;
    released, the worker drops it unrun (past its deadline); the server's shutdown joins the
    worker, so the metrics after it count every batch there was."""
    app = create_app(generator, timeout_s=0.3)
    queue = app.state.server.batcher.queue
    queue.hold()
    with running(app) as port:
        started = time.monotonic()
        status, body = generate(port, ["abc"])
        waited = time.monotonic() - started
        assert metric_samples(port)["edgeseq_queue_depth{}"] == 1  # still queued, unrun
        queue.release()
    samples = parse_metrics(app.state.server.metrics.text().decode())
    assert status == 504 and re.search(r"no answer within 0.3 s", body["error"])
    assert waited >= 0.3
    assert samples["edgeseq_inputs_total{}"] == 0 and samples["edgeseq_batch_size_count{}"] == 0
    assert samples["edgeseq_queue_depth{}"] == 0  # taken off the queue and dropped


def serve_process(bundle, *args: str) -> tuple[subprocess.Popen, int]:
    """`edgeseq serve BUNDLE --port 0 ARGS` in a subprocess; (process, port) once ready."""
    command = [*EDGESEQ, "serve", str(bundle), "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--provider", "cpu", "--threads", "1", *args],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        port = int(read_until(proc.stderr, r"Uvicorn running on http://127\.0\.0\.1:(\d+)")[1])
    except AssertionError as exc:
        raise AssertionError(f"server did not start (exit {proc.wait()}): {exc}") from None
    wait_ready(port, 60)
    return proc, port


def test_sigterm_answers_the_requests_in_flight_then_exits(generator, runtime_case) -> None:
    """The server shuts down (SIGTERM) while it handles three requests whose bodies it has not
    yet received (HeldRequest); sent once the shutdown began, they wait in the queue for their
    batch (max wait 1.5 s) while the server drains, and are answered before it exits."""
    proc, port = serve_process(runtime_case.bundle, "--max-wait-ms", "1500")
    try:
        held = [HeldRequest(port, [w]) for w in WORDS[:3]]
        proc.send_signal(signal.SIGTERM)
        read_until(proc.stderr, "Shutting down")  # uvicorn's first step of its shutdown
        for one in held:
            one.send_body()
        answers = [one.response() for one in held]
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.stderr.close()
    for word, answer in zip(WORDS, answers, strict=False):
        assert answer[0] == 200
        assert_same_json(answer[1], {"results": offline(generator, [word], {})})


def test_serve_cli_refusals(tmp_path) -> None:
    command = [*EDGESEQ, "serve"]
    proc = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert re.fullmatch(r"error: .*manifest\.json is missing.*\n", proc.stderr), proc.stderr
    proc = subprocess.run(
        [*command, str(tmp_path), "--replicas", "2"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "--replicas and --max-replicas apply with --ray" in proc.stderr
    proc = subprocess.run(
        [*command, str(tmp_path), "--ray", "--workers", "2"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert (
        proc.returncode == 2
        and "--max-batch-tokens and --workers apply without --ray" in proc.stderr
    )


def test_the_server_modules_import_without_torch() -> None:
    from test_torch_free import BLOCK_TORCH, python

    code = BLOCK_TORCH + (
        "import importlib, sys\n"
        "for name in ('app', 'batcher', 'metrics', 'request'):\n"
        "    importlib.import_module(f'edgeseq.runtime.serve.{name}')\n"
        "import edgeseq.cli.serve\n"
        "heavy = [m for m in ('torch', 'onnx', 'edgeseq.build_model', 'edgeseq.export')\n"
        "         if m in sys.modules]\n"
        "print(heavy)\n"
    )
    assert python(code).stdout.strip() == "[]"


def test_the_load_test_runs_on_loopback_and_stops_by_itself(runtime_case, tmp_path) -> None:
    words = tmp_path / "words.txt"
    words.write_text("\n".join(WORDS) + "\n")
    script = Path(__file__).parents[1] / "benchmarks" / "serve_load.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(runtime_case.bundle), "--words", str(words),
         "--clients", "4", "--requests", "40", "--duration", "20", "--rounds", "2"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(
        r"requests: 40 sent, 40 answered, 0 refused \(429\), 0 other, 0 lost", proc.stdout
    )
    assert "answers different from offline: 0" in proc.stdout
    assert re.search(r"latency p50 [\d.]+ ms, p99 [\d.]+ ms", proc.stdout)
