"""Token-id examples -> padded tensors for the model (the torch half of `tasks.make_batches`).

src, tgt_in, tgt_out = collate(examples, rows, cfg)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from edgeseq.runtime.config import ModelConfig


def collate(
    examples: list[tuple[list[int], list[int]]], rows: np.ndarray, cfg: ModelConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """src (B, S) = tokens + </s>; tgt_in (B, T) = <s> + tokens; tgt_out (B, T) = tokens + </s>."""
    picked = [examples[i] for i in rows]
    src_w = max(len(s) for s, _ in picked) + 1
    tgt_w = max(len(t) for _, t in picked) + 1
    pad, bos, eos = cfg.pad_id, cfg.bos_id, cfg.eos_id
    src = torch.full((len(picked), src_w), pad, dtype=torch.long)
    tgt_in = torch.full((len(picked), tgt_w), pad, dtype=torch.long)
    tgt_out = torch.full((len(picked), tgt_w), pad, dtype=torch.long)
    for r, (s, t) in enumerate(picked):
        src[r, : len(s) + 1] = torch.tensor([*s, eos])
        tgt_in[r, : len(t) + 1] = torch.tensor([bos, *t])
        tgt_out[r, : len(t) + 1] = torch.tensor([*t, eos])
    return src, tgt_in, tgt_out
