"""Model kinds in export: one module per kind, each exporting that kind's graphs, proving
their parity and writing the bundle, behind one interface (`Kind`).

    kind = kind_module(source.model.cfg.architecture)
    manifest = kind.export(source, "bundles/words", ExportOptions())
    report = kind.verify(load_bundle("bundles/words"), source, ExportOptions())

| `ModelConfig.architecture` | module | graphs it writes |
| --- | --- | --- |
| encoder-decoder | seq2seq/ | encoder.onnx + decoder.onnx (+ search, steps, inplace graphs) |
| decoder-only (GPT) | decoder_only | model.onnx + genai_config.json |
| encoder-only (BERT) | encoder_only | model.onnx |

Every kind takes the same arguments: the `SourceModel` an adapter loaded (export/sources/),
the output directory and `ExportOptions` (export/options.py); it picks its held-out inputs
with `held_out`, gates its variants with export/gate.py and writes the `variants` table with
export/variants.py. The one-graph kinds share their bundle writer and parity report
(one_graph.py) and provide its hooks (`NAME`, `export_graph`, `graph_inputs`,
`parity_levels`, `outputs`, `write_extra_files`). A new kind is a module here and a line in
`KIND_MODULES`; where the model comes from is export/sources/'s business, not the kind's.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from edgeseq.runtime.constants import DECODER_ONLY, ENCODER_DECODER, ENCODER_ONLY

if TYPE_CHECKING:
    from edgeseq.runtime.bundle import Bundle

    from ..options import ExportOptions
    from ..sources import SourceModel

KIND_MODULES = {
    ENCODER_DECODER: "seq2seq",
    DECODER_ONLY: "decoder_only",
    ENCODER_ONLY: "encoder_only",
}


class Kind(Protocol):
    """What a kind's module provides (module-level names)."""

    NAME: str  # manifest.json's "kind" ("encoder-decoder", "gpt", "bert")

    def export(
        self, source: SourceModel, out: str | Path, options: ExportOptions
    ) -> dict[str, Any]:
        """Write the bundle of `source` at `out`; return its manifest."""
        ...

    def verify(self, bundle: Bundle, source: SourceModel, options: ExportOptions) -> dict[str, Any]:
        """Re-run the parity groups `bundle`'s manifest lists against `source`; return the
        report (ParityError when one fails)."""
        ...


def kind_module(architecture: str) -> Kind:
    """The export module of `architecture` (a `ModelConfig.architecture`)."""
    return cast(Kind, importlib.import_module(f"{__name__}.{KIND_MODULES[architecture]}"))
