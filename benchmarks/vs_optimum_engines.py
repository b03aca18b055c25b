"""The engines of `vs_optimum.py`: each decodes batches of Marian source ids with the shared
search (greedy or beam, no sampling, length penalty 1, early stopping, no `</s>` forced at the
cap, at most max_new tokens) and keeps each cell's outputs for the comparison with
transformers'.

    engine = Ct2Engine("ctranslate2 int8", ct2_dir, "int8", threads, vocab, max_new)
    outputs, tokens = engine.run(batches, beam)      # Marian ids without </s>; tokens + </s>

`OptimumEngine` talks to `optimum_worker.py` in Optimum's own venv (one JSON line per call);
`TransformersEngine` runs the same `generate` call (`optimum_worker.generate_batches`) in this
process, and `Ct2Engine` CTranslate2's decode loop of `harness.translate_batches`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from harness import Outputs, translate_batches
from optimum_worker import generate_batches

HERE = Path(__file__).resolve().parent
SOURCE = "transformers eager"  # the engine every other is compared with


class Engine:
    """Keeps the outputs of each cell's last run, keyed (beam, batch size)."""

    name = ""

    def __init__(self) -> None:
        self.outputs: dict[tuple[int, int], Outputs] = {}

    def run(self, batches: Sequence[Sequence[list[int]]], beam: int) -> tuple[Outputs, int]:
        """Decode every batch of Marian source ids -> outputs (Marian ids, no `</s>`), tokens."""
        outputs, tokens = self.decode(batches, beam)
        self.outputs[beam, max(map(len, batches))] = outputs
        return outputs, tokens

    def decode(self, batches: Sequence[Sequence[list[int]]], beam: int) -> tuple[Outputs, int]:
        """What `run` returns, without keeping it; each engine implements it."""
        raise NotImplementedError


class TransformersEngine(Engine):
    """MarianMTModel.generate, PyTorch eager, in this process (on `device`, in `dtype`)."""

    name = SOURCE

    def __init__(
        self,
        marian_dir: Path,
        pad: int,
        max_new: int,
        device: str = "cpu",
        dtype: str = "float32",
        name: str = SOURCE,
    ) -> None:
        super().__init__()
        import torch
        from transformers import MarianMTModel

        model = MarianMTModel.from_pretrained(marian_dir, local_files_only=True).eval()
        self.model = model.to(device=device, dtype=getattr(torch, dtype))
        self.pad, self.max_new, self.name = pad, max_new, name

    def decode(self, batches, beam):
        return generate_batches(self.model, batches, beam, self.max_new, self.pad)


class OptimumEngine(Engine):
    """ORTModelForSeq2SeqLM.generate in `optimum_worker.py`, a process of its own venv."""

    name = "optimum"

    def __init__(
        self, python: Path, marian_dir: Path, onnx_dir: Path, threads: int, pad: int, max_new: int
    ) -> None:
        super().__init__()
        self.pad, self.max_new = pad, max_new
        command = [
            str(python),
            str(HERE / "optimum_worker.py"),
            str(marian_dir),
            str(onnx_dir),
            "--threads",
            str(threads),
        ]
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the Optimum worker exited ({self.process.wait()}) before ready")
        self.ready = json.loads(line)["ready"]

    def decode(self, batches, beam):
        request = {
            "batches": [list(map(list, b)) for b in batches],
            "beam": beam,
            "max_new_tokens": self.max_new,
            "pad": self.pad,
        }
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        return [tuple(o) for o in answer["outputs"]], answer["tokens"]

    def close(self) -> None:
        self.process.stdin.write("\n")
        self.process.stdin.close()
        self.process.wait(timeout=60)


class Ct2Engine(Engine):
    """A CTranslate2 Translator of the converted checkpoint at one compute type."""

    def __init__(
        self,
        name: str,
        path: Path,
        compute_type: str,
        threads: int,
        vocab: dict[str, int],
        max_new: int,
    ) -> None:
        super().__init__()
        import ctranslate2

        self.name, self.max_new = name, max_new
        self.translator = ctranslate2.Translator(
            str(path), device="cpu", compute_type=compute_type, intra_threads=threads
        )
        self.token_of = {i: t for t, i in vocab.items()}
        self.id_of = vocab

    def decode(self, batches, beam):
        return translate_batches(
            self.translator, batches, beam, self.max_new, self.token_of, self.id_of
        )


class EdgeseqEngine(Engine):
    """edgeseq's `Generator` of one variant of the bundle, default options."""

    def __init__(
        self,
        variant: str,
        bundle: Path,
        threads: int,
        texts: dict,
        max_new: int,
        provider: str = "cpu",
        name: str = "",
    ):
        super().__init__()
        from edgeseq.runtime.generator import Generator

        self.name, self.max_new = name or f"edgeseq {variant}", max_new
        self.generator = Generator.load(
            bundle, providers=provider, threads=threads, variant=variant
        )
        self.text_of = texts  # Marian source ids (tuple) -> text

    def decode(self, batches, beam):
        from edgeseq.runtime.search import GenerationOptions

        outputs, tokens = [], 0
        for batch in batches:
            options = GenerationOptions(  # edgeseq's defaults, not the bundle's: same search
                beam_size=beam, batch_size=len(batch), max_new_tokens=self.max_new
            ).filled()
            texts = [self.text_of[tuple(ids)] for ids in batch]
            for result in self.generator.generate(texts, options):
                outputs.append(tuple(i - 2 for i in result.token_ids))  # edgeseq -> Marian ids
                tokens += len(result.token_ids) + result.finished
        return outputs, tokens
