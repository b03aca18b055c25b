"""`edgeseq serve --ray` when a replica dies, and with an API key (issue 39, items 5 and 6).

One local Ray cluster for the module (`--replicas 2`, a key in `--api-key-file`): the key is
required as for `edgeseq serve`; then one model replica's process is killed (SIGKILL) while
12 clients send requests without pause (up to 3 times, until a kill hits a request in
flight). Every request must end in the offline answer or in a
retryable status (503 or 429, with `Retry-After`), none may take longer than `--timeout` plus
the proxy's grace, and Ray must bring the deployment back to 2 running replicas. Marked `ray`
(make test-ray); skipped when ray is not installed."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.ray
pytest.importorskip("ray.serve", reason="the ray extra is not installed (make test-ray)")
pytest.importorskip("starlette", reason="the serve extra is not installed")

from serve_client import EDGESEQ, HOST, wait_ready  # noqa: E402
from test_serve import WORDS, offline  # noqa: E402
from test_serve_ray import free_port  # noqa: E402

from edgeseq.runtime.generator import Generator  # noqa: E402
from edgeseq.runtime.serve.auth import ENV_VAR, ApiKey  # noqa: E402
from edgeseq.runtime.serve.ray_run import APP_NAME, PROXY_GRACE_S  # noqa: E402

KEY = "r4y-t3st-k3y-0f-the-faults"
BEARER = {"Authorization": f"Bearer {KEY}"}
TIMEOUT_S = 10.0  # the server's --timeout
LATEST_S = TIMEOUT_S + PROXY_GRACE_S  # the longest any answer may take
CLIENTS = 12  # 4 of them send HEAVY requests: a replica always has work when it is killed
RECOVERY_S = 60.0  # from a kill to 2 running replicas again
KILLS = 3  # at most, until one hits a request in flight (most do; an idle replica may not)
MODEL = "EdgeseqDeployment"
REPLICA_CLASS = f"ServeReplica:{APP_NAME}:{MODEL}"  # the model replicas' Ray actor class
OPTIONS = [{}, {"beam_size": 2, "n_best": 2}, {"sample": True, "seed": 3}]
LIGHT = [([WORDS[i % len(WORDS)], WORDS[(i + 3) % len(WORDS)]], OPTIONS[i % 3])
         for i in range(3 * len(WORDS))]  # fmt: skip
# 256 short inputs and a wide beam each (a replica runs one for a few tenths of a second),
# with options of their own: they never share a batch with LIGHT requests (a longer input in
# the batch would change scores in the 7th digit: padding is masked, but the kernels see
# other shapes), so every answer can be compared exactly.
HEAVY = [([WORDS[(i + j) % len(WORDS)] for j in range(256)], options)
         for i, options in enumerate([{"beam_size": 8}, {"beam_size": 6, "n_best": 3},
                                      {"beam_size": 5, "max_new_tokens": 12}])]  # fmt: skip
CASES = LIGHT + HEAVY


class Server:
    def __init__(self, port: int, proc: subprocess.Popen, ray_tmp: str, log: Path) -> None:
        self.port, self.proc, self.ray_tmp, self.log = port, proc, ray_tmp, log


@pytest.fixture(scope="module")
def server(runtime_case, tmp_path_factory) -> Iterator[Server]:
    """`edgeseq serve --ray --replicas 2` with a key file, on a local cluster of its own."""
    tmp = tmp_path_factory.mktemp("ray-faults")
    (tmp / "key").write_text(KEY + "\n", encoding="utf-8")
    port = free_port()
    command = [*EDGESEQ, "serve", str(runtime_case.bundle), "--ray", "--replicas", "2",
               "--port", str(port), "--provider", "cpu", "--threads", "1",
               "--max-wait-ms", "50", "--timeout", str(TIMEOUT_S),
               "--api-key-file", str(tmp / "key")]  # fmt: skip
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # socket paths under 107 bytes
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env.update(RAY_TMPDIR=ray_tmp, RAY_ADDRESS="")
    log_path = tmp / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_ready(port, 240, lambda: proc.poll() is None)  # /health needs no key
            yield Server(port, proc, ray_tmp, log_path)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(120) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            shutil.rmtree(ray_tmp, ignore_errors=True)
    print(log_path.read_text()[-3000:])
    assert KEY not in log_path.read_text()


def call(
    port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str, float]:
    """(status, lower-cased headers, body text, seconds) of one request; the socket gives up
    well after LATEST_S, so a hang shows as a late answer or an exception."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(HOST, port, timeout=LATEST_S + 10)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers or {})
        response = conn.getresponse()
        text = response.read().decode("utf-8")
        heads = {k.lower(): v for k, v in response.getheaders()}
        return response.status, heads, text, time.monotonic() - started
    finally:
        conn.close()


def generate(port: int, case: int, headers: dict[str, str] | None = BEARER) -> tuple:
    inputs, options = CASES[case]
    return call(port, "POST", "/v1/generate", {"inputs": inputs, "options": options}, headers)


def test_every_route_but_health_needs_the_key_from_the_file(server, runtime_case) -> None:
    generator = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
    status, _, text, _ = call(server.port, "GET", "/health")
    assert (status, json.loads(text)) == (200, {"status": "ready"})
    for headers in (None, {"Authorization": "Bearer wrong-key-0123456789"}, {"X": KEY}):
        for method, path in (("POST", "/v1/generate"), ("GET", "/v1/model"), ("GET", "/nope")):
            body = {"inputs": ["abc"]} if method == "POST" else None
            status, heads, text, _ = call(server.port, method, path, body, headers)
            assert (status, text, heads.get("www-authenticate")) == (401, "", "Bearer"), path
    for case in range(3):
        status, _, text, _ = generate(server.port, case)
        assert status == 200 and json.loads(text)["results"] == offline(generator, *CASES[case])
    assert call(server.port, "GET", "/v1/model", headers=BEARER)[0] == 200
    status, _, text, _ = call(server.port, "GET", "/nope", headers=BEARER)
    assert status == 404 and "no route" in json.loads(text)["error"]


# Run in a process of its own, a Ray driver on the server's cluster (this one imported ray
# before RAY_AUTH_MODE could be set). Prints the model replicas' PIDs once 2 run (healthy, per
# serve.status()) and none is `victim`, with the time.monotonic() of that moment; null if
# that does not happen by `until`.
MONITOR = """
import json, sys, time
import ray
from ray import serve
from ray.util.state import list_actors

app, model, actor_class, victim, until = sys.argv[1:4] + [int(sys.argv[4]), float(sys.argv[5])]
ray.init(namespace="serve", log_to_driver=False, logging_level="ERROR")
while time.monotonic() < until:
    alive = list_actors(filters=[("class_name", "=", actor_class), ("state", "=", "ALIVE")])
    pids = sorted(actor.pid for actor in alive)
    status = serve.status().applications[app].deployments[model]
    running = status.replica_states.get("RUNNING", 0) if status.status == "HEALTHY" else 0
    if victim not in pids and len(pids) == 2 and running == 2:
        print(json.dumps([time.monotonic(), pids]))
        break
    time.sleep(0.25)
else:
    print("null")
ray.shutdown()
"""


def replicas_running(server: Server, victim: int, within_s: float) -> tuple[float, list] | None:
    """(when, PIDs) once 2 model replicas run and `victim` is not one (MONITOR); None if not
    within `within_s`. The driver uses Ray's default token authentication, as the server."""
    [port_file] = Path(server.ray_tmp, "ray", "session_latest").glob("gcs_server_port_*")
    env = {**os.environ, "RAY_TMPDIR": server.ray_tmp,
           "RAY_ADDRESS": f"127.0.0.1:{port_file.read_text().strip()}",
           "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}  # fmt: skip
    until = time.monotonic() + within_s
    command = [sys.executable, "-c", MONITOR, APP_NAME, MODEL, REPLICA_CLASS, victim, until]
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, env=env,
                          timeout=within_s + 60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(outcomes: list[tuple[int, Any]], expected: list) -> tuple[Counter, list, float]:
    """(count per status, the outcomes that are neither the offline answer nor a retryable
    status with Retry-After, or came late, the slowest answer's seconds)."""
    statuses: Counter[Any] = Counter()
    wrong = []
    for case, outcome in outcomes:
        if isinstance(outcome, Exception):
            statuses[type(outcome).__name__] += 1
            wrong.append((case, repr(outcome)))
            continue
        status, heads, text, seconds = outcome
        statuses[status] += 1
        if status == 200:
            ok = json.loads(text)["results"] == expected[case]
        else:
            ok = status in (429, 503) and heads.get("retry-after", "").isdigit()
        if not ok or seconds > LATEST_S:
            wrong.append((case, status, heads.get("retry-after"), text[:200], round(seconds, 2)))
    latest = max((o[3] for _, o in outcomes if not isinstance(o, Exception)), default=0.0)
    return statuses, wrong, latest


def test_a_killed_replica_costs_retryable_answers_only(server, runtime_case, capsys) -> None:
    """Kill a model replica under load and wait for Ray to replace it; again (at most KILLS
    times) while no kill has hit a request in flight, which would leave nothing tested."""
    generator = Generator.load(runtime_case.bundle, providers="cpu", threads=1)
    expected = [offline(generator, inputs, options) for inputs, options in CASES]
    outcomes: list[tuple[int, Any]] = []  # (case, call() or the exception raised)
    stop, numbers = threading.Event(), itertools.count()

    def client(cases: list[int]) -> None:
        while not stop.is_set():
            case = cases[next(numbers) % len(cases)]
            try:
                outcomes.append((case, generate(server.port, case)))
            except OSError as exc:  # refused, reset or timed out: a failure below
                outcomes.append((case, exc))

    running = replicas_running(server, victim=0, within_s=30)
    assert running is not None, "the deployment does not run 2 replicas"
    pids = running[1]
    light, heavy = list(range(len(LIGHT))), list(range(len(LIGHT), len(CASES)))
    clients = [threading.Thread(target=client, args=(heavy if i < 4 else light,))
               for i in range(CLIENTS)]  # fmt: skip
    for thread in clients:
        thread.start()
    recoveries: list[float] = []  # seconds from each kill to 2 running replicas again
    try:
        while len(recoveries) < KILLS and not check(outcomes, expected)[0][503]:
            answered = len(outcomes)
            deadline = time.monotonic() + 60
            while len(outcomes) < answered + 50 and time.monotonic() < deadline:
                time.sleep(0.05)  # under load
            assert len(outcomes) >= answered + 50, "the load did not start"
            os.kill(pids[0], signal.SIGKILL)
            killed = time.monotonic()
            running = replicas_running(server, pids[0], RECOVERY_S)
            assert running is not None, f"not 2 running replicas {RECOVERY_S:g} s after a kill"
            recoveries.append(running[0] - killed)
            pids = running[1]
    finally:
        stop.set()
        for thread in clients:
            thread.join(LATEST_S + 20)
    statuses, wrong, latest = check(outcomes, expected)
    with capsys.disabled():  # the numbers, also under `pytest -q` (make test-ray)
        print(
            f"\n{len(recoveries)} kill(s) under load, {len(outcomes)} requests: {dict(statuses)}, "
            f"slowest {latest:.2f} s; 2 replicas running again after "
            + ", ".join(f"{s:.1f} s" for s in recoveries)
        )
    assert not wrong, wrong[:10]
    assert statuses[503] >= 1, f"{KILLS} kills, none with a request in flight: nothing tested"
    for case in range(len(CASES)):  # the new replicas answer as the old ones
        status, _, text, _ = generate(server.port, case)
        assert status == 200 and json.loads(text)["results"] == expected[case]


def test_ray_warns_once_without_a_key_and_passes_only_the_digest(runtime_case, monkeypatch):
    """`--ray` applies the key and the exposure warning of `edgeseq serve` (the deployment
    itself is not started here: run_ray is replaced)."""
    from click.testing import CliRunner

    from edgeseq.cli.serve import serve as serve_command
    from edgeseq.runtime.serve import ray_run

    started: list[tuple[dict, str, int, float]] = []
    monkeypatch.setattr(ray_run, "run_ray", lambda *args: started.append(args))
    monkeypatch.delenv(ENV_VAR, raising=False)
    command = [str(runtime_case.bundle), "--ray", "--host", "0.0.0.0", "--timeout", "7"]
    result = CliRunner().invoke(serve_command, command)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("warning: serving on 0.0.0.0 without an API key") == 1
    [(args, host, _, timeout_s)] = started
    assert host == "0.0.0.0" and timeout_s == 7 and "api_key_sha256" not in args
    result = CliRunner().invoke(serve_command, command, env={ENV_VAR: KEY})
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output
    args = started[1][0]
    assert args["api_key_sha256"] == ApiKey.of(KEY).sha256 and KEY not in repr(args)
