"""Model kinds in PyTorch: the class each `ModelConfig.architecture` names.

    model = build_transformer(cfg)         # whichever class cfg.architecture names

| architecture | module | class |
| --- | --- | --- |
| encoder-decoder | model.py | Seq2SeqTransformer |
| decoder-only (GPT) | decoder_only.py | DecoderOnlyTransformer |
| encoder-only (BERT) | encoder_only.py | EncoderOnlyTransformer |

A new kind is a module of its class (from the blocks of build_model/model.py) and a line in
`MODEL_CLASSES`.
"""

from __future__ import annotations

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.constants import DECODER_ONLY, ENCODER_DECODER, ENCODER_ONLY

from .decoder_only import DecoderOnlyTransformer
from .encoder_only import EncoderOnlyTransformer
from .model import Seq2SeqTransformer

Model = Seq2SeqTransformer | DecoderOnlyTransformer | EncoderOnlyTransformer
MODEL_CLASSES: dict[str, type[Model]] = {
    ENCODER_DECODER: Seq2SeqTransformer,
    DECODER_ONLY: DecoderOnlyTransformer,
    ENCODER_ONLY: EncoderOnlyTransformer,
}


def build_transformer(cfg: ModelConfig) -> Model:
    """The model class `cfg.architecture` names, freshly initialised."""
    return MODEL_CLASSES[cfg.architecture](cfg)
