"""Write a random-weight model of model.py as a user of the PyTorch tutorial would save it:
the state_dict in safetensors, one vocabulary file per side (one token per line, the
tutorial's special tokens <unk> <pad> <bos> <eos> at ids 0..3) and the mapping edgeseq reads.

    python examples/torch_transformer/make_example.py OUT_DIR
    edgeseq export OUT_DIR/torch_source.json ...          # (see docs: importing a model)
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
from pathlib import Path

import torch
from model import build  # run as a script: model.py sits beside this file
from safetensors.torch import save_model

SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>"]  # the tutorial's UNK, PAD, BOS, EOS = 0..3
SOURCE_TOKENS = list(string.ascii_lowercase)
TARGET_TOKENS = list(string.ascii_uppercase)
MAPPING = {
    "factory": "model.py:build",
    "factory_kwargs": {"src_vocab_size": 30, "tgt_vocab_size": 30, "maxlen": 128},
    "weights": "model.safetensors",
    "transformer": "transformer",
    "source_embedding": "src_tok_emb",
    "target_embedding": "tgt_tok_emb",
    "positional": "positional_encoding",
    "generator": "generator",
    "source_vocab": "src_vocab.txt",
    "target_vocab": "tgt_vocab.txt",
    "special_tokens": {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model = build(**MAPPING["factory_kwargs"]).eval()
    save_model(model, str(args.out / "model.safetensors"))  # handles tied weights too
    for name, tokens in (("src_vocab.txt", SOURCE_TOKENS), ("tgt_vocab.txt", TARGET_TOKENS)):
        (args.out / name).write_text("\n".join(SPECIALS + tokens) + "\n", encoding="utf-8")
    shutil.copy(Path(__file__).with_name("model.py"), args.out / "model.py")
    text = json.dumps(MAPPING, indent=2, sort_keys=True) + "\n"
    (args.out / "torch_source.json").write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: model.py, model.safetensors, vocabularies, torch_source.json")


if __name__ == "__main__":
    main()
