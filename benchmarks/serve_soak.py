"""Soak test of `edgeseq serve`: minutes of mixed traffic on 127.0.0.1 against a server it
starts itself, checking that nothing leaks, fails or is lost.

    python benchmarks/serve_soak.py bundles/g2p-en --minutes 10 --clients 8

Traffic, drawn at random by each client thread, one request at a time on its own connection:
valid requests (greedy, beam 3 with n-best 2, seeded sampling) of 1-4 words, bodies that are
not JSON or have wrong types, bodies over the size limit, clients that send half a request and
hang up, and bursts of 48 parallel requests over the server's queue limit (`--max-queue 16`).

Reports, per minute, requests and p50/p99 latency of the valid ones; the server's resident
memory at start and end and its slope (least squares over samples every 5 s, MB per minute);
the status codes seen. Fails (exit 1) on any 5xx, any request without an answer, or any 200
answer that differs from offline `Generator.generate` with the same options (use an fp32
bundle: int8 answers depend on the batch a request joins).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from edgeseq.runtime.generator import Generator
from edgeseq.runtime.results import result_json
from edgeseq.runtime.search import GenerationOptions

HOST = "127.0.0.1"
_SCRIPT = Path(sys.executable).with_name("edgeseq")
EDGESEQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "edgeseq.cli.main"]
WORDS = [
    "hello",
    "world",
    "cafe",
    "transformer",
    "banana",
    "photograph",
    "university",
    "quick",
    "brown",
    "fox",
]
OPTIONS = [{}, {"beam_size": 3, "n_best": 2}, {"sample": True, "seed": 11, "top_k": 5}]
MAX_QUEUE, BURST = 16, 48


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def post(port: int, body: bytes, timeout: float = 60.0) -> tuple[int, bytes]:
    """(status, body) of POST /v1/generate; status 0 when no answer came."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/generate", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def same(got: dict, want: dict) -> bool:
    """One answer equals the offline one: every field, scores within 1e-4 (a batch's padding
    changes the order of float sums, never the tokens of an fp32 bundle)."""
    if set(got) != set(want):
        return False
    for key, value in want.items():
        if key in ("score", "logprob"):
            if abs(got[key] - value) > 1e-4:
                return False
        elif key == "nbest":
            if len(got[key]) != len(value) or not all(map(same, got[key], value)):
                return False
        elif got[key] != value:
            return False
    return True


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Soak:
    """The traffic, its records and the offline answers it is checked against."""

    def __init__(self, port: int, generator: Generator, seconds: float) -> None:
        self.port, self.generator, self.start = port, generator, time.monotonic()
        self.stop = self.start + seconds
        self.lock = threading.Lock()
        self.statuses: Counter[int] = Counter()
        self.latency: dict[int, list[float]] = defaultdict(list)  # minute -> seconds
        self.problems: list[str] = []
        self.expected: dict[str, list[dict]] = {}

    def offline(self, inputs: list[str], options: dict) -> list[dict]:
        key = json.dumps([inputs, options])
        if key not in self.expected:
            results = self.generator.generate(inputs, GenerationOptions(**options))
            target = self.generator.tokenizers.target
            rows = [result_json(i, t, r, target) for i, (t, r) in enumerate(
                zip(inputs, results, strict=True), start=1)]  # fmt: skip
            self.expected[key] = json.loads(json.dumps(rows))
        return self.expected[key]

    def record(self, kind: str, status: int, seconds: float, ok: bool, detail: str = "") -> None:
        with self.lock:
            self.statuses[status] += 1
            if kind == "valid" and status == 200:
                self.latency[int((time.monotonic() - self.start) // 60)].append(seconds)
            if not ok:
                self.problems.append(f"{kind}: status {status} {detail}"[:300])

    def valid(self, rng: random.Random) -> None:
        inputs = rng.sample(WORDS, rng.randint(1, 4))
        options = rng.choice(OPTIONS)
        body = json.dumps({"inputs": inputs, "options": options}).encode()
        began = time.monotonic()
        status, raw = post(self.port, body)
        seconds = time.monotonic() - began
        if status == 200:
            got, want = json.loads(raw)["results"], self.offline(inputs, options)
            diff = next(
                (f"{a} != {b}" for a, b in zip(got, want, strict=True) if not same(a, b)), ""
            )
            self.record("valid", status, seconds, not diff, f"{options}: {diff}")
        else:
            self.record("valid", status, seconds, status in (429, 503), raw.decode()[:200])

    def invalid(self, rng: random.Random) -> None:
        body = rng.choice([b"{not json", b'{"inputs": 3}', b'{"inputs": ["a"], "x": 1}'])
        status, _ = post(self.port, body)
        self.record("invalid", status, 0.0, status in (400, 422, 429))

    def oversized(self, rng: random.Random) -> None:
        body = json.dumps({"inputs": ["a" * 2000] * rng.randint(1, 300)}).encode()
        status, _ = post(self.port, body)
        self.record("oversized", status, 0.0, status in (413, 422, 429))

    def hang_up(self, rng: random.Random) -> None:
        with socket.create_connection((HOST, self.port), timeout=5) as sock:
            head = "POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\n"
            sock.sendall(head.encode() + b'{"inputs": ["hel')
        self.record("hang-up", -1, 0.0, True)

    def burst(self, rng: random.Random) -> None:
        with ThreadPoolExecutor(BURST) as pool:
            list(pool.map(lambda _: self.valid(random.Random(rng.random())), range(BURST)))

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        actions = [self.valid] * 12 + [self.invalid, self.oversized, self.hang_up]
        while time.monotonic() < self.stop:
            action = self.burst if rng.random() < 0.005 else rng.choice(actions)
            action(rng)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args()
    generator = Generator.load(args.bundle, providers="cpu", threads=args.threads)
    port = free_port()
    command = [*EDGESEQ, "serve", str(args.bundle), "--port", str(port), "--provider", "cpu"]
    command += ["--threads", str(args.threads), "--max-queue", str(MAX_QUEUE)]
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (a pipe nobody reads would fill)
    server = subprocess.Popen(command, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 120
        while post(port, b'{"inputs": ["a"]}', timeout=5)[0] != 200:
            if time.monotonic() > deadline or server.poll() is not None:
                log.seek(0)
                sys.exit(f"error: the server did not start: {log.read()[-500:]}")
            time.sleep(0.5)
        soak = Soak(port, generator, args.minutes * 60)
        memory: list[tuple[float, float]] = []
        threads = [threading.Thread(target=soak.client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            memory.append(((time.monotonic() - soak.start) / 60, rss_mb(server.pid)))
            time.sleep(5)
        for t in threads:
            t.join()
    finally:
        server.terminate()
        server.wait(timeout=60)
    report(soak, memory, args)


def _ms(values: list[float], percent: float) -> float:
    return round(1000 * float(np.percentile(values, percent)), 1)


def report(soak: Soak, memory: list[tuple[float, float]], args: argparse.Namespace) -> None:
    minutes = np.array([m for m, _ in memory])
    mb = np.array([v for _, v in memory])
    slope = float(np.polyfit(minutes, mb, 1)[0]) if len(memory) > 2 else float("nan")
    per_minute = {
        minute: {"requests": len(values), "p50_ms": _ms(values, 50), "p99_ms": _ms(values, 99)}
        for minute, values in sorted(soak.latency.items())
    }  # fmt: skip
    errors_5xx = sum(n for status, n in soak.statuses.items() if status >= 500)
    lost = soak.statuses.get(0, 0)
    out = {
        "minutes": args.minutes, "clients": args.clients, "threads": args.threads,
        "statuses": {str(k): v for k, v in sorted(soak.statuses.items())},
        "rss_mb_start": round(float(mb[0]), 1), "rss_mb_end": round(float(mb[-1]), 1),
        "rss_mb_per_minute": round(slope, 3), "per_minute": per_minute,
        "5xx": errors_5xx, "lost": lost, "problems": soak.problems[:20],
    }  # fmt: skip
    print("minute  requests  p50 ms  p99 ms")
    for minute, row in per_minute.items():
        print(f"{minute:>6}  {row['requests']:>8}  {row['p50_ms']:>6}  {row['p99_ms']:>6}")
    print(f"statuses {out['statuses']} (-1: hang-ups, which get no answer by design)")
    print(
        f"server RSS {out['rss_mb_start']} -> {out['rss_mb_end']} MB, slope {slope:+.3f} MB/min;"
        f" 5xx {errors_5xx}, lost {lost}, problems {len(soak.problems)}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    if errors_5xx or lost or soak.problems:
        for line in soak.problems[:5]:
            print(f"  {line}")
        sys.exit(1)


if __name__ == "__main__":
    main()
