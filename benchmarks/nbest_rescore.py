"""Would a second model pick better among a checkpoint's beam hypotheses? n-best rescoring.

    python benchmarks/nbest_rescore.py models/g2p-en --with old/r6 --with old/r8 --split dev

CHECKPOINT's beam search (`--beam`, every finished hypothesis kept) gives each source of the
split up to `--beam` candidates; each `--with` checkpoint (same tokenizers) scores every
candidate teacher-forced, log p(candidate | source) summed over its tokens and `</s>`. For
each partner and weight w the pick is argmax log p(CHECKPOINT) + w * log p(partner), and for
w = 0 (CHECKPOINT alone, ranked by summed log-probability); also the oracle (a candidate
equal to a reference whenever one is among them). Scored like `edgeseq evaluate`: WER and
PER against any reference.

Earlier shipped versions of `models/g2p-en` come out of git history, e.g.
`mkdir -p old/r8 && for f in config.json model.safetensors task.json tokenizer.json
tokenizer.target.json train_state.json; do git show 077c480:models/g2p-en/$f > old/r8/$f; done`.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import torch

from edgeseq.build_model.batching import collate
from edgeseq.build_model.checkpoint import load_checkpoint
from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.build_model.tasks import load_task
from edgeseq.build_model.torch_step import TorchStep
from edgeseq.runtime.metrics import score
from edgeseq.runtime.padding import right_pad
from edgeseq.runtime.search import beam_search
from edgeseq.runtime.tokenizer import TokenizerPair


def nbest(
    model: Seq2SeqTransformer, tokenizers: TokenizerPair, sources: list[str], beam: int
) -> list[list[tuple[list[int], float]]]:
    """Per source, up to `beam` hypotheses (target ids, summed log-probability), best first."""
    step = TorchStep(model)
    encoded = [tokenizers.source.encode(s)[: step.max_len - 1] for s in sources]
    order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))
    out: list[list[tuple[list[int], float]]] = [[] for _ in sources]
    for start in range(0, len(order), 64):
        rows = order[start : start + 64]
        src = right_pad([[*encoded[i], step.eos_id] for i in rows], step.pad_id)
        for i, hyps in zip(rows, beam_search(step, src, beam, None, 1.0, beam), strict=True):
            out[i] = [(list(h.tokens), h.logprob) for h in hyps]
    return out


@torch.no_grad()
def teacher_forced_logprob(
    model: Seq2SeqTransformer, pairs: list[tuple[list[int], list[int]]], batch: int = 512
) -> np.ndarray:
    """Summed log p(target + `</s>` | source) of each (source ids, target ids) pair, (N,)."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
    result = np.zeros(len(pairs))
    for start in range(0, len(order), batch):
        rows = np.array(order[start : start + batch])
        src, tgt_in, tgt_out = collate(pairs, rows, model.cfg)
        logp = torch.log_softmax(model(src, tgt_in).float(), -1)  # (B, T, V)
        picked = logp.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)  # (B, T)
        result[rows] = (picked * (tgt_out != model.cfg.pad_id)).sum(1).numpy()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--with", dest="partners", action="append", required=True)
    parser.add_argument("--split", default="dev", choices=("train", "dev", "test"))
    parser.add_argument("--limit", type=int)
    parser.add_argument("--beam", type=int, default=8)
    parser.add_argument("--weights", default="0.3,0.5,1")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizers, meta = load_checkpoint(args.checkpoint)
    refs = load_task(meta.task["name"], **meta.task["options"]).references(args.split)
    sources = list(refs)[: args.limit]
    targets = [refs[s] for s in sources]
    started = time.perf_counter()
    lists = nbest(model, tokenizers, sources, args.beam)
    print(
        f"beam {args.beam} n-best of {len(sources)} sources: {time.perf_counter() - started:.0f} s"
    )
    flat = [
        (tokenizers.source.encode(s)[: model.cfg.max_len - 1], ids)
        for s, hyps in zip(sources, lists, strict=True)
        for ids, _ in hyps
    ]
    own = np.array([lp for hyps in lists for _, lp in hyps])
    bounds = np.cumsum([0, *[len(h) for h in lists]])

    def pick(scores: np.ndarray) -> list[str]:
        best = [
            lists[i][int(np.argmax(scores[a:b]))][0]
            for i, (a, b) in enumerate(itertools.pairwise(bounds))
        ]
        return [tokenizers.target.decode(ids) for ids in best]

    def row(name: str, texts: list[str]) -> None:
        m = score(texts, targets, str.split, False)
        print(f"| {name} | {100 * m['wer']:.2f}% | {100 * m['per']:.2f}% |")

    print("\n| pick | WER | PER |\n|---|--:|--:|")
    row(f"{args.checkpoint} alone", pick(own))
    texts = [[tokenizers.target.decode(ids) for ids, _ in hyps] for hyps in lists]
    row(
        "oracle",
        [next((t for t in ts if t in r), ts[0]) for ts, r in zip(texts, targets, strict=True)],
    )
    for partner in args.partners:
        other, other_tokenizers, _ = load_checkpoint(partner)
        if other_tokenizers.target.vocab_size != tokenizers.target.vocab_size:
            raise SystemExit(f"{partner}: its tokenizers differ from {args.checkpoint}'s")
        theirs = teacher_forced_logprob(other, flat)
        for w in (float(x) for x in args.weights.split(",")):
            row(f"+ {w} x {partner}", pick(own + w * theirs))


if __name__ == "__main__":
    main()
