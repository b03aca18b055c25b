"""The two graphs of a bundle, as small explicit `nn.Module`s around a `Seq2SeqTransformer`.

    encoder = OnnxEncoder(model).eval()        # src_ids -> memory, cross_k.*, cross_v.*
    decoder = OnnxDecoderStep(model).eval()    # one KV-cached decoder step

Each wrapper's `forward` takes and returns exactly the graph's inputs and outputs, in the
order of `runtime/constants.py` (K/V as one tensor per decoder layer, tuples here, flattened
into `cross_k.0`, `cross_k.1`, ... by the exporter), and calls the model's own methods: no
patched `forward`, no second implementation of the model. Shapes use L = n_decoder_layers,
B = batch, H = n_heads, S = src_len, P = past_len, N = new_len, D = d_model, dh = d_head,
V = tgt vocab.
"""

from __future__ import annotations

from torch import Tensor, nn

from edgeseq.build_model.model import Seq2SeqTransformer


class OnnxEncoder(nn.Module):
    """Encoder graph: run once per input batch.

    Inputs:
        src_ids    int64   [B, S]         source ids, right-padded with pad_id; ends with `</s>`
    Outputs:
        memory     float32 [B, S, D]      encoder output (not needed by the decoder graph)
        cross_k.i  float32 [B, H, S, dh]  cross-attention keys of decoder layer i (L of them)
        cross_v.i  float32 [B, H, S, dh]  cross-attention values of decoder layer i

    Padding positions (src_ids == pad_id) are masked inside the graph.
    """

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        """src_ids (B, S) -> memory (B, S, D), L cross_k then L cross_v (B, H, S, dh)."""
        src_keep = self.model.source_keep(src_ids)  # (B, S) bool
        memory = self.model.encode(src_ids, src_keep)  # (B, S, D)
        cross_k, cross_v = self.model.cross_kv(memory)  # L-tuples of (B, H, S, dh)
        return (memory, *cross_k, *cross_v)


class OnnxDecoderStep(nn.Module):
    """Decoder-step graph: feeds N new target tokens after P cached ones.

    Inputs:
        input_ids    int64   [B, N]           new target ids at positions P..P+N-1
        past_k.i     float32 [B, H, P, dh]    self-attention keys so far of layer i (P may be 0)
        past_v.i     float32 [B, H, P, dh]    self-attention values so far of layer i
        cross_k.i    float32 [B, H, S, dh]    from the encoder graph
        cross_v.i    float32 [B, H, S, dh]    from the encoder graph
        src_mask     bool    [B, S]           True where the source token is real (not pad)
    Outputs:
        logits       float32 [B, N, V]        next-token scores for each new position
        present_k.i  float32 [B, H, P+N, dh]  past_k.i with the new tokens' keys appended
        present_v.i  float32 [B, H, P+N, dh]  past_v.i with the new tokens' values appended

    The position of the first new token is P, the cache length: rows P..P+N-1 of the
    positional table (an initializer) are added. The graph does not check P + N <= max_len;
    the caller must refuse longer sequences (slicing past the table yields too few rows).
    Each new token attends to every cached position and to the new tokens up to itself.
    """

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        past_k: tuple[Tensor, ...],
        past_v: tuple[Tensor, ...],
        cross_k: tuple[Tensor, ...],
        cross_v: tuple[Tensor, ...],
        src_mask: Tensor,
    ) -> tuple[Tensor, ...]:
        """One step -> logits (B, N, V), L present_k then L present_v (B, H, P+N, dh)."""
        logits, present_k, present_v = self.model.decode_step(
            input_ids, past_k, past_v, cross_k, cross_v, src_mask
        )
        return (logits, *present_k, *present_v)
