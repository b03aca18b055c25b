"""`edgeseq serve --ray` (issue 28): the bundle as a Ray Serve deployment on a local Ray
cluster that the command starts and shuts down. Marked `ray` (run by `make test-ray`, not by
`make test`): ray is a large install and a cluster takes tens of seconds to start; skipped
when ray is not installed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
pytest.importorskip("ray.serve", reason="the ray extra is not installed (make test-ray)")
pytest.importorskip("starlette", reason="the serve extra is not installed")

import yaml  # noqa: E402  (a dependency of ray)
from serve_client import EDGESEQ, generate, request, wait_ready  # noqa: E402
from test_serve import WORDS, offline  # noqa: E402

from edgeseq.runtime.generator import Generator  # noqa: E402
from edgeseq.runtime.serve.ray_app import ARGS  # noqa: E402

SERVE_YAML = Path(__file__).parents[1] / "deploy" / "serve.yaml"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ray_serve_answers_concurrent_requests_as_offline(runtime_case, tmp_path) -> None:
    generator = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
    port = free_port()
    command = [*EDGESEQ, "serve", str(runtime_case.bundle),
               "--ray", "--replicas", "2", "--port", str(port), "--provider", "cpu",
               "--threads", "1", "--max-wait-ms", "20"]  # fmt: skip
    # Ray's socket paths must stay under 107 bytes: a short private temp dir, not tmp_path.
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_ADDRESS": ""}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(port, 240, lambda: proc.poll() is None)
        cases = [([WORDS[i % len(WORDS)], WORDS[(i + 3) % len(WORDS)]],
                  [{}, {"beam_size": 2, "n_best": 2}, {"sample": True, "seed": 3}][i % 3])
                 for i in range(24)]  # fmt: skip
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda c: generate(port, *c), cases))
        for (inputs, options), (status, body) in zip(cases, answers, strict=True):
            assert status == 200, body
            assert body["results"] == offline(generator, inputs, options)
        status, body = generate(port, ["abc"], {"n_best": 2})
        assert status == 422 and re.search(r"n_best \(2\) cannot exceed", body["error"])
        status, _, model = request(port, "GET", "/v1/model")
        assert status == 200 and model["bundle"] == runtime_case.bundle.name
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)  # gone before its log and Ray's directory are removed
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print((tmp_path / "serve.log").read_text()[-2000:])


def test_serve_yaml_is_a_valid_ray_serve_config() -> None:
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load(SERVE_YAML.read_text())
    schema = ServeDeploySchema.model_validate(config)
    [app] = schema.applications
    assert app.import_path == "edgeseq.runtime.serve.ray_app:build"
    assert set(app.args) <= set(ARGS) and "bundle" in app.args
