"""`edgeseq serve` with an API key (issue 39, item 6): a bearer token from --api-key-file or
EDGESEQ_API_KEY on every route but /health (and /metrics unless --metrics-auth); 401 with an
empty body and `WWW-Authenticate: Bearer`; a warning, once, for a reachable address without
a key; weak or unreadable keys refused in one line. The same logic (runtime/serve/auth.py)
guards the Ray deployment, tested at the end when ray is installed (make test-ray)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from serve_client import EDGESEQ, HOST, running, wait_ready
from test_serve import offline

from edgeseq.runtime.generator import Generator
from edgeseq.runtime.serve.app import create_app
from edgeseq.runtime.serve.auth import (
    ENV_VAR,
    ApiKey,
    ApiKeyError,
    api_key_digest,
    exposure_warning,
    is_loopback,
    read_api_key,
)

KEY = "k3y-0f-the-t3sts-aZ_9.~"  # printable ASCII, 23 characters
BEARER = {"Authorization": f"Bearer {KEY}"}


def call(
    port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """(status, lower-cased headers, body text) of one request to 127.0.0.1:port."""
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers or {})
        response = conn.getresponse()
        text = response.read().decode("utf-8")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, text
    finally:
        conn.close()


def generate_with(port: int, headers: dict[str, str] | None, inputs: list[str]) -> tuple[int, str]:
    status, _, text = call(port, "POST", "/v1/generate", {"inputs": inputs}, headers)
    return status, text


def assert_unauthorized(answer: tuple[int, dict[str, str], str]) -> None:
    status, headers, text = answer
    assert (status, text) == (401, ""), answer
    assert headers["www-authenticate"] == "Bearer"


# -- the key ------------------------------------------------------------------------------------
def test_the_key_comes_from_the_file_then_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(f"  {KEY}\nignored second line\n", encoding="utf-8")
    other = "another-key-of-20-chars"
    assert read_api_key(path, {ENV_VAR: other}) == ApiKey.of(KEY)  # the file wins
    assert read_api_key(None, {ENV_VAR: other}) == ApiKey.of(other)
    assert read_api_key(None, {}) is None
    assert KEY not in repr(ApiKey.of(KEY))  # only the digest is kept


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("short-key", "a key of 9 characters; use at least 16"),
        ("a key with spaces inside", "spaces or characters outside printable ASCII"),
        ("ключ-не-ascii-символы", "outside printable ASCII"),
    ],
)
def test_weak_or_unusable_keys_are_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "key"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ApiKeyError, match=message):
        read_api_key(path, {})
    with pytest.raises(ApiKeyError, match=f"the variable {ENV_VAR} .*{message}"):
        read_api_key(None, {ENV_VAR: content})
    with pytest.raises(ApiKeyError, match="cannot be read"):
        read_api_key(tmp_path / "absent", {})


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (f"Bearer {KEY}", True),
        (f"bearer {KEY}", True),  # the scheme is case-insensitive (RFC 7235)
        (f"  Bearer   {KEY}  ", True),
        (f"Bearer {KEY}x", False),
        (f"Bearer {KEY[:-1]}", False),
        (f"Basic {KEY}", False),
        (KEY, False),
        ("Bearer", False),
        ("", False),
        (None, False),
        ("Bearer \udcff", False),  # not encodable: refused, not an exception
    ],
)
def test_only_the_bearer_token_is_accepted(header: str | None, accepted: bool) -> None:
    assert ApiKey.of(KEY).accepts(header) is accepted


def test_the_warning_names_reachable_addresses_only() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "localhost", "::1", "[::1]"):
        assert is_loopback(host) and exposure_warning(host, None) is None, host
    for host in ("0.0.0.0", "::", "192.168.1.20", "example.org"):
        warning = exposure_warning(host, None)
        assert warning and f"serving on {host} without an API key" in warning, host
        assert exposure_warning(host, ApiKey.of(KEY)) is None


def test_the_ray_deployment_gets_the_digest(tmp_path: Path) -> None:
    digest = ApiKey.of(KEY).sha256
    assert api_key_digest(digest, None, {ENV_VAR: "ignored-because-digest"}) == digest
    path = tmp_path / "key"
    path.write_text(KEY, encoding="utf-8")
    assert api_key_digest(None, path, {}) == digest
    assert api_key_digest(None, None, {ENV_VAR: KEY}) == digest
    assert api_key_digest(None, None, {}) is None
    with pytest.raises(ApiKeyError, match="64 lowercase hex digits"):
        api_key_digest(KEY, None, {})


# -- the application ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def generator(runtime_case) -> Generator:
    return Generator.load(runtime_case.bundle, providers="cpu", threads=1)


def test_every_route_but_health_and_metrics_needs_the_key(generator) -> None:
    app = create_app(generator, api_key=ApiKey.of(KEY))
    with running(app) as port:
        assert call(port, "GET", "/health")[0] == 200
        for headers in (None, {"Authorization": "Bearer wrong-key-of-some-length"},
                        {"Authorization": f"Basic {KEY}"}):  # fmt: skip
            assert_unauthorized(call(port, "POST", "/v1/generate", {"inputs": ["abc"]}, headers))
            assert_unauthorized(call(port, "GET", "/v1/model", headers=headers))
        status, text = generate_with(port, BEARER, ["abc", "jihg"])
        assert status == 200
        assert json.loads(text)["results"] == offline(generator, ["abc", "jihg"], {})
        status, _, model = call(port, "GET", "/v1/model", headers=BEARER)
        assert status == 200 and json.loads(model)["variant"] == "fp32"
        status, _, metrics = call(port, "GET", "/metrics")  # open by default
        assert status == 200
        assert re.search(
            r'edgeseq_requests_total\{endpoint="generate",status="401"\} 3\.0', metrics
        )
        assert re.search(r'edgeseq_requests_total\{endpoint="model",status="401"\} 3\.0', metrics)


def test_metrics_auth_puts_metrics_behind_the_key(generator) -> None:
    app = create_app(generator, api_key=ApiKey.of(KEY), metrics_auth=True)
    with running(app) as port:
        assert_unauthorized(call(port, "GET", "/metrics"))
        assert call(port, "GET", "/metrics", headers=BEARER)[0] == 200
        assert call(port, "GET", "/health")[0] == 200


def test_without_a_key_nothing_changes(generator) -> None:
    with running(create_app(generator)) as port:
        assert generate_with(port, None, ["abc"])[0] == 200
        assert call(port, "GET", "/v1/model")[0] == 200


# -- the command ----------------------------------------------------------------------------------
def start(bundle: Path, *args: str, env: dict[str, str] | None = None) -> tuple[Any, int, list]:
    """`edgeseq serve BUNDLE --port 0 ARGS`: (process, port, stderr lines up to ready)."""
    command = [*EDGESEQ, "serve", str(bundle), "--port", "0", "--provider", "cpu"]
    proc = subprocess.Popen(
        [*command, "--threads", "1", *args], stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )  # fmt: skip
    lines = []
    for line in proc.stderr:
        lines.append(line)
        found = re.search(r"Uvicorn running on http://[^:]+:(\d+)", line)
        if found:
            port = int(found.group(1))
            wait_ready(port, 60)
            return proc, port, lines
    raise AssertionError(f"server did not start (exit {proc.wait()}): {''.join(lines)}")


def stop(proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    proc.stderr.close()


def test_serve_takes_the_key_from_a_file(runtime_case, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    proc, port, lines = start(runtime_case.bundle, "--api-key-file", str(key_file))
    try:
        assert "API key required" in lines[0] and not any("warning" in x for x in lines)
        assert_unauthorized(call(port, "POST", "/v1/generate", {"inputs": ["abc"]}))
        assert generate_with(port, BEARER, ["abc"])[0] == 200
        assert call(port, "GET", "/metrics")[0] == 200
    finally:
        stop(proc)


def test_serve_warns_once_on_a_reachable_address_without_a_key(runtime_case) -> None:
    env = {ENV_VAR: ""}  # set but empty is an error, not "no key"
    failed = subprocess.run(
        [*EDGESEQ, "serve", str(runtime_case.bundle), "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert failed.returncode == 1
    assert failed.stderr == f"error: the variable {ENV_VAR} is empty; put a key in it " + (
        "(python -c 'import secrets; print(secrets.token_urlsafe(32))')\n"
    )
    clean = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    proc, port, lines = start(runtime_case.bundle, "--host", "0.0.0.0", env=clean)
    try:
        warnings = [x for x in lines if x.startswith("warning: serving on 0.0.0.0 without")]
        assert len(warnings) == 1, lines
        assert generate_with(port, None, ["abc"])[0] == 200
    finally:
        stop(proc)


def test_serve_takes_the_key_from_the_environment(runtime_case) -> None:
    proc, port, lines = start(
        runtime_case.bundle, "--host", "0.0.0.0", "--metrics-auth", env={ENV_VAR: KEY}
    )
    try:
        assert not any(x.startswith("warning:") for x in lines), lines
        assert_unauthorized(call(port, "GET", "/metrics"))
        assert_unauthorized(call(port, "GET", "/v1/model"))
        assert call(port, "GET", "/v1/model", headers=BEARER)[0] == 200
    finally:
        stop(proc)


def test_metrics_auth_without_a_key_is_a_usage_error(runtime_case) -> None:
    clean = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    result = subprocess.run(
        [*EDGESEQ, "serve", str(runtime_case.bundle), "--metrics-auth"],
        capture_output=True, text=True, timeout=60, env=clean,
    )  # fmt: skip
    assert result.returncode == 2 and "--metrics-auth needs a key" in result.stderr
    result = subprocess.run(
        [*EDGESEQ, "serve", str(runtime_case.bundle), "--metrics-auth", "--ray"],
        capture_output=True, text=True, timeout=60, env={**clean, ENV_VAR: KEY},
    )  # fmt: skip
    assert result.returncode == 2 and "--metrics-auth applies without --ray" in result.stderr


# -- the same under Ray (make test-ray) ---------------------------------------------------------
@pytest.mark.ray
def test_ray_serve_needs_the_key_too(runtime_case, tmp_path: Path) -> None:
    pytest.importorskip("ray.serve", reason="the ray extra is not installed (make test-ray)")
    from test_serve_ray import free_port

    port = free_port()
    command = [*EDGESEQ, "serve", str(runtime_case.bundle), "--ray", "--port", str(port),
               "--provider", "cpu", "--threads", "1"]  # fmt: skip
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # socket paths under 107 bytes
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_ADDRESS": "", ENV_VAR: KEY}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(port, 240, lambda: proc.poll() is None)  # /health needs no key
        assert_unauthorized(call(port, "POST", "/v1/generate", {"inputs": ["abc"]}))
        assert_unauthorized(call(port, "GET", "/v1/model", headers={"Authorization": "Bearer x"}))
        status, text = generate_with(port, BEARER, ["abc"])
        generator = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
        assert status == 200 and json.loads(text)["results"] == offline(generator, ["abc"], {})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert KEY not in (tmp_path / "serve.log").read_text()
