"""Knowledge distillation: train a student on its teachers' next-token distributions.

    teachers = load_teachers(["runs/a/last", "runs/b/last"], tokenizers, student_cfg)
    logits = student(src, tgt_in)                          # (B, T, V)
    kd = distillation_loss(logits, teacher_logits(teachers, src, tgt_in, bf16=True),
                           tgt_out != pad_id, temperature=1.0)

The teachers are run in eval mode (no dropout) on the same teacher-forced reference prefix as
the student; their ensemble distribution is the mean of their softmaxes at `temperature`. The
loss is KL(teachers || student) per target token, times temperature², averaged over the
non-padding positions (Hinton et al., 2015, word-level distillation in Kim & Rush, 2016).
`edgeseq train --teacher CKPT` mixes it with the label-smoothed cross-entropy:
(1 - distill_weight) * CE + distill_weight * KD.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from torch.nn import functional as F

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import CheckpointError, ConfigError
from edgeseq.runtime.tokenizer import TokenizerPair

from .checkpoint import load_checkpoint
from .model import Seq2SeqTransformer


def load_teachers(
    paths: Sequence[str | Path], tokenizers: TokenizerPair, cfg: ModelConfig
) -> list[Seq2SeqTransformer]:
    """Load each teacher checkpoint in eval mode with gradients off. ConfigError unless every
    teacher has the student's tokenizers (the same ids for the same symbols) and can read
    sequences as long as the student's `max_len`."""
    teachers = []
    for path in paths:
        if not Path(path).exists():
            raise CheckpointError(
                f"teacher {path} does not exist; give an existing checkpoint (a resumed run "
                "needs its teachers where they were when it started)"
            )
        model, teacher_tokenizers, _ = load_checkpoint(path)
        for side in ("source", "target"):
            mine, theirs = getattr(tokenizers, side), getattr(teacher_tokenizers, side)
            if mine.to_str() != theirs.to_str():
                raise ConfigError(
                    f"teacher {path} has another {side} vocabulary than the student; a teacher "
                    "must share the student's tokenizers (start the student with --init-from a "
                    "checkpoint of the same task, or train the teacher on it)"
                )
        if model.cfg.max_len < cfg.max_len:
            raise ConfigError(
                f"teacher {path} reads at most {model.cfg.max_len} tokens, the student "
                f"{cfg.max_len}; use a teacher with max_len >= the student's"
            )
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        teachers.append(model)
    return teachers


@torch.no_grad()
def teacher_logits(
    teachers: Sequence[Seq2SeqTransformer], src: Tensor, tgt_in: Tensor, bf16: bool
) -> list[Tensor]:
    """Each teacher's logits (B, T, V) as float32 for src (B, S) and tgt_in (B, T)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return [teacher(src, tgt_in).float() for teacher in teachers]


def distillation_loss(
    student_logits: Tensor, teachers_logits: Sequence[Tensor], mask: Tensor, temperature: float
) -> Tensor:
    """Mean over positions where `mask` is true of temperature² · KL(p ‖ q), p the mean of the
    teachers' softmax(logits / temperature) and q the student's. Logits are (..., V), e.g.
    (B, T, V) or flattened (B * T, V), and `mask` has their leading shape."""
    t = float(temperature)
    probs = torch.stack([F.softmax(logits / t, dim=-1) for logits in teachers_logits]).mean(0)
    log_q = F.log_softmax(student_logits.float() / t, dim=-1)
    log_p = torch.log(probs.clamp_min(1e-12))
    kl = (probs * (log_p - log_q)).sum(-1)  # (B, T)
    weights = mask.to(kl.dtype)
    return (kl * weights).sum() / weights.sum().clamp_min(1.0) * t * t
