"""Peak resident memory (RSS) of `Generator.generate` and of `edgeseq serve` under load, each
case in a fresh process, for the in-place cache's memory bounds (issue 44).

    python benchmarks/peak_rss.py /tmp/g2p-ip --inputs 256 --json /tmp/rss-g2p.json
    python benchmarks/peak_rss.py /tmp/opus-ip --inputs 128 --json /tmp/rss-opus.json
    python benchmarks/peak_rss.py --table /tmp/before.json /tmp/after.json   # before/after

Cases (`--cases`, default all five):
- `generate-greedy`, `generate-beam4`: one process loads the bundle on the CPU and runs one
  `Generator.generate` over the inputs at batch 32 (greedy, or beam 4 with n-best 1); it
  reports its RSS after loading, its peak (VmHWM, /proc/self/status), its RSS at the end
  (what stays held between calls), the seconds and a sha256 of every output's ids (equal
  hashes: equal outputs);
- `generate-beam4-x4`: the same with 4 threads calling `generate` on one Generator at once,
  each on a quarter of the inputs (as `edgeseq serve --workers 4` runs batches);
- `serve-greedy`, `serve-beam4`: `edgeseq serve` (started as benchmarks/serve_load.py starts
  it, max batch 32) loaded by `--clients` concurrent clients on loopback, each sending one
  input per request (beam: `"options": {"beam_size": 4}`) until all inputs are sent; the
  server's VmHWM is read before it is stopped.

Inputs: the g2p task's test words (`serve_load.load_words`) for a bundle whose task is g2p,
else the made-up sentences of benchmarks/marian_opus.py (`held_out_sentences`), or `--texts
FILE`. The code measured is whichever `edgeseq` Python imports (the report names its
directory and commit): put another checkout first on PYTHONPATH to measure it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # serve_load, marian_opus

CASES = ("generate-greedy", "generate-beam4", "generate-beam4-x4", "serve-greedy", "serve-beam4")
BATCH, BEAM, THREADS_X4 = 32, 4, 4


def status_mb(pid: int | str, field: str) -> float:
    """A memory field of /proc/PID/status (VmHWM: peak RSS, VmRSS: RSS now) in MB; for this
    process without /proc, ru_maxrss."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_texts(bundle: str, path: str | None, count: int) -> list[str]:
    """`count` inputs: FILE's lines, the g2p test words for a g2p bundle, else the made-up
    sentences of an opus-mt-sized Marian."""
    from serve_load import load_words

    task = json.loads((Path(bundle) / "config.json").read_text()).get("task") or {}
    if path or task.get("name") == "g2p":
        return load_words(path, count)
    from marian_opus import held_out_sentences

    return held_out_sentences(count)


def code_version() -> dict:
    """Directory and git commit of the edgeseq runtime this process imports."""
    import edgeseq.runtime

    where = Path(edgeseq.runtime.__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(where), "status", "--porcelain", "--", "runtime"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {"code": str(where), "commit": commit + ("+dirty runtime/" if dirty else "")}


def options_of(case: str):
    """GenerationOptions of a case: greedy or beam 4, batch 32."""
    from edgeseq.runtime.search import GenerationOptions

    beam = BEAM if "beam4" in case else 1
    return GenerationOptions(beam_size=beam, batch_size=BATCH).filled()  # edgeseq's defaults


def run_generate(args: argparse.Namespace) -> dict:
    """The worker of a generate case (in its own process): load, generate, measure."""
    from edgeseq.runtime.generator import Generator

    texts = load_texts(args.bundle, args.texts, args.inputs)
    gen = Generator.load(args.bundle, providers="cpu", threads=args.threads)
    loaded = status_mb("self", "VmRSS")
    options = options_of(args.case)
    start = time.perf_counter()
    if args.case.endswith("-x4"):
        parts = [texts[i::THREADS_X4] for i in range(THREADS_X4)]
        with ThreadPoolExecutor(THREADS_X4) as pool:
            answers = list(pool.map(lambda part: gen.generate(part, options), parts))
        results = [answers[i % THREADS_X4][i // THREADS_X4] for i in range(len(texts))]
    else:
        results = gen.generate(texts, options)
    seconds = time.perf_counter() - start
    ids = [[list(h.token_ids) for h in r.nbest] for r in results]
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
    tokens = sum(len(r.nbest[0].token_ids) for r in results if r.nbest)
    return {"loaded_mb": loaded, "peak_mb": status_mb("self", "VmHWM"),
            "end_mb": status_mb("self", "VmRSS"), "seconds": seconds, "tokens": tokens,
            "outputs_sha256": digest}  # fmt: skip


async def drive(port: int, texts: list[str], clients: int, options: dict) -> list[int]:
    """`clients` keep-alive connections sending one text per request until all are sent;
    the HTTP status of each answer."""
    from serve_load import HOST, post

    statuses: list[int] = []
    queue = list(reversed(texts))

    async def client() -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            while queue:
                body = {"inputs": [queue.pop()], **({"options": options} if options else {})}
                statuses.append((await post(reader, writer, json.dumps(body).encode()))[0])
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return statuses


def run_serve(args: argparse.Namespace) -> dict:
    """A serve case: start the server, load it, read its peak RSS, stop it."""
    from serve_load import free_port, start_server

    texts = load_texts(args.bundle, args.texts, args.inputs)
    port = free_port()
    server = argparse.Namespace(max_batch=BATCH, max_wait_ms=args.max_wait_ms)
    proc = start_server(args.bundle, port, args.threads, server)
    try:
        loaded = status_mb(proc.pid, "VmRSS")
        options = {"beam_size": BEAM} if "beam4" in args.case else {}
        start = time.perf_counter()
        statuses = asyncio.run(drive(port, texts, args.clients, options))
        seconds = time.perf_counter() - start
        peak, end = status_mb(proc.pid, "VmHWM"), status_mb(proc.pid, "VmRSS")
    finally:
        proc.terminate()
        proc.wait(60)
    return {"loaded_mb": loaded, "peak_mb": peak, "end_mb": end, "seconds": seconds,
            "answered": statuses.count(200), "requests": len(statuses)}  # fmt: skip


def run_case(args: argparse.Namespace, case: str) -> dict:
    """One case in a fresh process (this script with --worker): its JSON line."""
    command = [sys.executable, __file__, args.bundle, "--worker", case,
               "--inputs", str(args.inputs), "--threads", str(args.threads),
               "--clients", str(args.clients), "--max-wait-ms", str(args.max_wait_ms)]  # fmt: skip
    command += ["--texts", args.texts] if args.texts else []
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"error: case {case} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def merged(runs: list[dict]) -> list[dict]:
    """Runs with the same label (one per bundle) as one run with all their cases."""
    by_label: dict[str, dict] = {}
    for run in runs:
        into = by_label.setdefault(run["label"], {**run, "cases": {}})
        into["cases"].update(run["cases"])
    return list(by_label.values())


def table(runs: list[dict]) -> str:
    """Markdown table per bundle and case: loaded RSS, then peak and end RSS and seconds per
    label (before, after), and whether the outputs' hashes agree."""
    runs = merged(runs)
    head = " | ".join(f"peak MB {r['label']} | end MB {r['label']} | s {r['label']}" for r in runs)
    lines = [f"| bundle | case | loaded MB | {head} | outputs |",
             "|---|---|---|" + "---|---|---|" * len(runs) + "---|"]  # fmt: skip
    nan = float("nan")
    for key, row in runs[0]["cases"].items():
        others = [r["cases"].get(key, {}) for r in runs]
        cells = " | ".join(
            " | ".join(f"{o.get(k, nan):{f}}" for k, f in (("peak_mb", ".0f"), ("end_mb", ".0f"),
                                                           ("seconds", ".1f")))
            for o in others
        )  # fmt: skip
        hashes = {o.get("outputs_sha256") for o in others}
        same = "-" if None in hashes else ("identical" if len(hashes) == 1 else "DIFFER")
        bundle, case = key.split(" ", 1)
        lines.append(f"| {bundle} | {case} | {row['loaded_mb']:.0f} | {cells} | {same} |")
    lines.append("code: " + "; ".join(f"{r['label']} = {r['code']} at {r['commit']}" for r in runs))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", nargs="?")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated")
    parser.add_argument("--inputs", type=int, default=256, help="inputs per case")
    parser.add_argument("--texts", metavar="FILE", help="one input per line")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--clients", type=int, default=32, help="serve: concurrent clients")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="serve: batch wait")
    parser.add_argument("--label", default="run", help="column name in --table")
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print runs side by side")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    """Run the cases (or print --table) and report."""
    args = parse_args()
    if args.table:
        print(table([json.loads(Path(p).read_text()) for p in args.table]))
        return
    if args.worker:
        args.case = args.worker
        result = run_serve(args) if args.case.startswith("serve") else run_generate(args)
        print(json.dumps(result))
        return
    if not args.bundle:
        raise SystemExit("error: give a bundle directory (or --table JSON...)")
    run = {"label": args.label, **code_version(), "cases": {}}
    for case in args.cases.split(","):
        result = run_case(args, case)
        run["cases"][f"{Path(args.bundle).name} {case}"] = result
        print(f"{case}: peak {result['peak_mb']:.0f} MB (loaded {result['loaded_mb']:.0f} MB), "
              f"{result['seconds']:.1f} s", file=sys.stderr)  # fmt: skip
    print(table([run]))
    if args.json:
        Path(args.json).write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
