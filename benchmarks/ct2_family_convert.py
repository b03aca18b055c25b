"""`ct2-transformers-converter` for the random-weight checkpoints of tests/large_shapes.py.

    python benchmarks/ct2_family_convert.py --model CHECKPOINT --output_dir CT2_DIR \\
        [--quantization int8]                        # the converter's own options

Those checkpoints have the published models' rows (128,112 for M2M-100-418M, 250,054 for
mBART-large-50) but tokenizers trained here, with a few hundred tokens: CTranslate2 refuses a
vocabulary smaller than the embedding. This pads it with made-up tokens up to the model's
rows (the inputs never use them), and gives an mBART config without `normalize_before` (the
field transformers 5 no longer writes) the value mBART has, pre-norm. A published checkpoint
needs neither: convert it with `ct2-transformers-converter` itself.
"""

from __future__ import annotations

import sys
from typing import Any

from ctranslate2.converters import transformers as ct2


def padded_vocabulary(loader: Any, model: Any, tokenizer: Any) -> list[str]:
    """The loader's vocabulary, made-up tokens appended up to `model.config.vocab_size`."""
    tokens = ct2.BartLoader.get_vocabulary(loader, model, tokenizer)
    rows = model.config.vocab_size
    return tokens[:rows] + [f"madeupword_pad{i}" for i in range(rows - len(tokens))]


def pre_norm_spec(loader: Any, model: Any) -> Any:
    """MBartLoader's spec, with `normalize_before` True where the config lacks it."""
    if not hasattr(model.config, "normalize_before"):
        model.config.normalize_before = True
    return ct2.BartLoader.get_model_spec(loader, model)


def main() -> int:
    """Run the converter's command line with the two changes (module docstring)."""
    for loader in (ct2.BartLoader, ct2.M2M100Loader, ct2.MBartLoader):
        loader.get_vocabulary = padded_vocabulary
    ct2.MBartLoader.get_model_spec = pre_norm_spec
    ct2.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
