"""Model kinds in the runtime: one module per kind, each the `Generator` subclass that opens
that kind's graphs and adapts what differs (the step model, encoding, the answer).

    generator_class("decoder-only")    # -> kinds.decoder_only.GPTGenerator

| `config.json` architecture | module | class | graphs |
| --- | --- | --- | --- |
| encoder-decoder | seq2seq | Seq2SeqGenerator | encoder.onnx + decoder.onnx (+ search.onnx) |
| decoder-only (GPT) | decoder_only | GPTGenerator | model.onnx |
| encoder-only (BERT) | encoder_only | BertClassifier | model.onnx |

This registry sits below the classes it picks: it names their modules and imports the one a
bundle needs when asked (`Generator.load` calls it), so the kind modules may import
runtime/generator.py without an import cycle. A new kind is a module here that defines
`GENERATOR` (its class, with an `open` classmethod) and a line in `KIND_MODULES`.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..constants import DECODER_ONLY, ENCODER_DECODER, ENCODER_ONLY
from ..errors import BundleError

KIND_MODULES = {
    ENCODER_DECODER: "seq2seq",
    DECODER_ONLY: "decoder_only",
    ENCODER_ONLY: "encoder_only",
}


def generator_class(architecture: str) -> Any:
    """The `Generator` subclass that runs bundles of `architecture` (config.json's)."""
    module = KIND_MODULES.get(architecture)
    if module is None:
        raise BundleError(
            f"config.json names the architecture {architecture!r}, which this edgeseq does "
            f"not run ({', '.join(KIND_MODULES)}); upgrade edgeseq or re-export the bundle"
        )
    return importlib.import_module(f"{__name__}.{module}").GENERATOR
