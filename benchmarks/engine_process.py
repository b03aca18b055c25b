"""An engine of `vs_optimum.py` in a process of its own, so that engines with thread pools of
their own (onnxruntime, CTranslate2, PyTorch) never share the cores' pools in one process.

    engine = ProcessEngine("ctranslate2 int8", {"kind": "ctranslate2", "path": "runs/x/ct2",
                           "compute_type": "int8", "vocab": "runs/x/marian/vocab.json"},
                           threads=2, max_new=96)
    outputs, tokens = engine.run(batches, beam)       # as the in-process engines answer
    engine.close()

The harness calls one engine at a time, so the idle processes wait on a pipe while one
computes: with `--threads 2` each engine gets both cores to itself. Measured in one process,
`vs_optimum.py --threads 2` gave CTranslate2 fp32 less than its 1-thread speed (several
libraries' pools oversubscribing two cores). The worker (this file run as a script) reads
one JSON line, the engine's spec, builds it (`vs_optimum_engines`), prints `{"ready": true}`
and answers one JSON line per request, `{"batches": ..., "beam": B}` ->
`{"outputs": ..., "tokens": N}`; an empty line ends it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from vs_optimum_engines import Engine  # noqa: E402


class ProcessEngine(Engine):
    """An engine built from `spec` in a worker process (module docstring)."""

    def __init__(
        self,
        name: str,
        spec: dict[str, Any],
        threads: int,
        max_new: int,
        worker: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        """Start `worker` (a script and its arguments whose main loop is `serve`; default:
        this file) with `extra_env` added to the environment, and send it `spec`."""
        super().__init__()
        self.name = name
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        env |= extra_env or {}
        self.process = subprocess.Popen(
            [sys.executable, *(worker or [str(Path(__file__).resolve())])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._send(spec | {"name": name, "threads": threads, "max_new": max_new})
        answer = self._receive()
        if not answer.get("ready"):
            raise RuntimeError(f"the {name} worker did not start: {answer}")

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited ({self.process.wait()})")
        return json.loads(line)

    def decode(self, batches, beam):
        self._send({"batches": [list(map(list, b)) for b in batches], "beam": beam})
        answer = self._receive()
        return [tuple(o) for o in answer["outputs"]], answer["tokens"]

    def close(self) -> None:
        """End the worker."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write("\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)


def build(spec: dict[str, Any]) -> Engine:
    """The in-process engine a spec describes (kind transformers, ctranslate2 or edgeseq)."""
    from vs_optimum_engines import Ct2Engine, EdgeseqEngine, TransformersEngine

    threads, max_new = spec["threads"], spec["max_new"]
    if spec["kind"] == "transformers":
        import torch

        torch.set_num_threads(threads)
        return TransformersEngine(Path(spec["marian"]), spec["pad"], max_new)
    if spec["kind"] == "ctranslate2":
        vocab = json.loads(Path(spec["vocab"]).read_text(encoding="utf-8"))
        path, compute = Path(spec["path"]), spec["compute_type"]
        return Ct2Engine(spec["name"], path, compute, threads, vocab, max_new)
    texts = {tuple(ids): text for ids, text in spec["texts"]}
    return EdgeseqEngine(spec["variant"], Path(spec["bundle"]), threads, texts, max_new)


def serve(
    lines: Sequence[str] | Any = sys.stdin, build: Callable[[dict[str, Any]], Engine] = build
) -> None:
    """The worker's loop (module docstring); `build` makes the engine of the first line."""
    engine = None
    for line in lines:
        if not line.strip():
            return
        message = json.loads(line)
        if engine is None:
            engine = build(message)
            print(json.dumps({"ready": True}), flush=True)
            continue
        outputs, tokens = engine.decode(message["batches"], message["beam"])
        print(json.dumps({"outputs": outputs, "tokens": tokens}), flush=True)


if __name__ == "__main__":
    serve()
