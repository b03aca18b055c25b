"""Model kinds in export: one module per kind, each exporting that kind's graphs, proving
their parity and writing the bundle.

    kind_module("decoder-only").export(model, tokenizers, "bundles/words", held=held)

| `ModelConfig.architecture` | module | graphs it writes |
| --- | --- | --- |
| encoder-decoder | seq2seq | encoder.onnx + decoder.onnx (+ search.onnx) |
| decoder-only (GPT) | decoder_only | model.onnx + genai_config.json |
| encoder-only (BERT) | encoder_only | model.onnx |

Each module has `export(model, tokenizers, out, *, task, held, opset, force, verify,
variants, progress, ...) -> manifest` and `verify(bundle, manifest, model, tokenizers,
held, progress) -> report`. The one-graph kinds share their bundle writer, int8 gate and
parity report (one_graph.py) and provide its hooks (`NAME`, `export_graph`, `graph_inputs`,
`parity_levels`, `outputs`, `write_extra_files`). A new kind is a module here and a line in
`KIND_MODULES`; where the model comes from (an edgeseq checkpoint, a torch module, a Hugging
Face checkpoint) is export/sources/'s business, not the kind's.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from edgeseq.runtime.constants import DECODER_ONLY, ENCODER_DECODER, ENCODER_ONLY

KIND_MODULES = {
    ENCODER_DECODER: "seq2seq",
    DECODER_ONLY: "decoder_only",
    ENCODER_ONLY: "encoder_only",
}


def kind_module(architecture: str) -> ModuleType:
    """The export module of `architecture` (a `ModelConfig.architecture`)."""
    return importlib.import_module(f"{__name__}.{KIND_MODULES[architecture]}")
