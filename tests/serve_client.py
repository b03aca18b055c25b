"""Helpers for the server tests: run an app on an ephemeral loopback port, and a small
stdlib HTTP client (the tests need nothing beyond the `serve` extra)."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

HOST = "127.0.0.1"
# The installed console script (beside the interpreter in a venv), else the group's module.
_SCRIPT = Path(sys.executable).with_name("edgeseq")
EDGESEQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "edgeseq.cli.main"]


@contextlib.contextmanager
def running(app: Any, ready_timeout_s: float = 60.0) -> Iterator[int]:
    """Serve `app` with uvicorn on 127.0.0.1 and an ephemeral port, in a thread; yield the
    port once /health answers 200; stop the server (lifespan shutdown included) after."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_ready(port, ready_timeout_s)
        yield port
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def wait_ready(port: int, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Poll GET /health until 200; fail after `timeout_s` or once `alive()` is False."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise AssertionError(f"the server for port {port} exited before it was ready")
        with contextlib.suppress(OSError):
            if request(port, "GET", "/health")[0] == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"server on port {port} not ready within {timeout_s} s")


def request(
    port: int, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, dict[str, str], Any]:
    """(status, headers, parsed JSON body or text) of one request to 127.0.0.1:port."""
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read().decode("utf-8")
        kind = response.getheader("content-type", "")
        parsed = json.loads(payload) if kind.startswith("application/json") else payload
        return response.status, {k.lower(): v for k, v in response.getheaders()}, parsed
    finally:
        conn.close()


def generate(port: int, inputs: list[str], options: dict | None = None) -> tuple[int, Any]:
    """(status, body) of POST /v1/generate."""
    status, _, body = request(
        port, "POST", "/v1/generate", {"inputs": inputs, "options": options or {}}
    )
    return status, body


def read_until(stream: IO[str], pattern: str) -> re.Match:
    """Read lines of `stream` (a server's stderr) up to one where `pattern` is found; its
    match. AssertionError, with the lines read, if the stream ends first."""
    lines = []
    for line in stream:
        lines.append(line)
        if found := re.search(pattern, line):
            return found
    raise AssertionError(f"{pattern!r} not found in {''.join(lines)!r}")


class HeldRequest:
    """A POST /v1/generate whose body waits: its headers ask `Expect: 100-continue`, and the
    constructor returns once the server answers 100 Continue, which it does when the app
    starts reading the body. From then on the server is handling the request (a graceful
    shutdown waits for it) and cannot have answered it: `send_body`, then `response`."""

    def __init__(self, port: int, inputs: list[str], options: dict | None = None) -> None:
        self.body = json.dumps({"inputs": inputs, "options": options or {}}).encode()
        self.sock = socket.create_connection((HOST, port), timeout=60)
        head = (
            f"POST /v1/generate HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n"
            "Expect: 100-continue\r\n\r\n"
        )
        self.sock.sendall(head.encode("ascii"))
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):  # byte by byte: read nothing past it
            byte = self.sock.recv(1)
            if not byte:
                raise AssertionError(f"connection closed before 100 Continue: {interim!r}")
            interim += byte
        if not interim.startswith(b"HTTP/1.1 100 "):
            raise AssertionError(f"expected 100 Continue, got {interim!r}")

    def send_body(self) -> None:
        """Send the JSON body the headers announced."""
        self.sock.sendall(self.body)

    def response(self) -> tuple[int, Any]:
        """(status, parsed JSON body or text) of the answer; closes the connection."""
        try:
            answer = http.client.HTTPResponse(self.sock)
            answer.begin()
            payload = answer.read().decode("utf-8")
            kind = answer.getheader("content-type", "")
            return answer.status, json.loads(payload) if kind.startswith(
                "application/json"
            ) else payload
        finally:
            self.sock.close()


# Scores move in the 7th significant digit with the batch a row runs in (docs/runtime.md):
# the server batches across requests, so its answers equal offline ones up to that.
SCORE_TOLERANCE = 1e-5
SCORE_KEYS = ("score", "logprob")


def assert_same_json(got: Any, want: Any) -> None:
    """Equal `generate --json` answers (lists of result objects, n-best included): every
    field exactly, scores and log-probabilities within SCORE_TOLERANCE."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (got, want)
        for key, value in want.items():
            if key in SCORE_KEYS:
                assert abs(got[key] - value) <= SCORE_TOLERANCE, (key, got[key], value)
            else:
                assert_same_json(got[key], value)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for g, w in zip(got, want, strict=True):
            assert_same_json(g, w)
    else:
        assert got == want


def assert_same_results(got: list[Any], want: list[Any]) -> None:
    """Equal `Generator.generate` results: every field exactly, scores and log-probabilities
    (of the result and its n-best) within SCORE_TOLERANCE."""
    from dataclasses import asdict

    assert_same_json([asdict(r) for r in got], [asdict(r) for r in want])
