"""The decoder-only kind (GPT) in PyTorch: `DecoderOnlyTransformer`, built from the
encoder–decoder's blocks (build_model/model.py), and `TorchGPTStep`, its step adapter for
runtime/search.py (`edgeseq.runtime.step.StepModel`).

    gpt = DecoderOnlyTransformer(cfg)      # cfg.architecture == "decoder-only"
    logits, k, v = gpt.step(input_ids, position_ids, attention_mask, past_k, past_v)
    continuations = greedy_search(TorchGPTStep(gpt), prompt_ids, max_new_tokens=20)

A GPT block is an `EncoderLayer` run through `forward_cached` with a causal mask. The model
also takes `forward(src_ids, tgt_in)` like `Seq2SeqTransformer`, so one training loop trains
every kind: it models `tgt_in` (src_ids is unused).

`TorchGPTStep.start(prompt_ids)` takes right-padded prompts (no `<s>`, no `</s>`; an empty
prompt is a (B, 0) array) and only remembers them. The first `step` receives `<s>` (what
search feeds first) and runs `<s>` + prompt in one call, returning the logits at each row's
last real token as (B, 1, V); later steps feed the new tokens after the cache. Pads left
inside the cache by shorter prompts are hidden by the attention mask; positions count real
tokens only. Its state is the runtime's `GPTState` holding tensors.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.errors import InputTooLongError, OptionsError
from edgeseq.runtime.kinds.decoder_only import GPTState

from .model import Cache, EncoderLayer, PositionalEncoding, TokenEmbedding, final_norm, init_linears


class DecoderOnlyTransformer(nn.Module):
    """GPT: token embedding x sqrt(d) + positional table rows, `n_decoder_layers` causal
    self-attention + FFN blocks with a KV cache, final linear over the one vocabulary."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model)
        self.pos = PositionalEncoding(cfg.max_len, cfg.d_model, cfg.positional)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.norm = final_norm(cfg)
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=not cfg.tie_output)
        if cfg.tie_output:
            self.output.weight = self.embed.weight
        init_linears(self, self.output)

    def empty_cache(self, batch: int, like: Tensor) -> tuple[Cache, Cache]:
        """An empty cache: two L-tuples of (B, H, 0, dh) tensors."""
        cfg = self.cfg
        empty = like.new_zeros((batch, cfg.n_heads, 0, cfg.d_head), dtype=torch.float32)
        return (empty,) * cfg.n_decoder_layers, (empty,) * cfg.n_decoder_layers

    def step(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        attention_mask: Tensor,
        past_k: Cache,
        past_v: Cache,
    ) -> tuple[Tensor, Cache, Cache]:
        """New tokens over a cache (the graph of a GPT bundle).

        input_ids (B, N) int64 at cache slots P..P+N-1; position_ids (B, N) int64 rows of the
        positional table; attention_mask (B, P+N) int64 or bool, nonzero at real tokens (pads
        anywhere: left or right padding); past_k/past_v L-tuples of (B, H, P, dh) -> logits
        (B, N, V) and present_k/v, L-tuples of (B, H, P+N, dh). Slot j is visible from slot i
        when j <= i and attention_mask[:, j] is set; every slot sees itself, so a pad row
        stays finite.
        """
        past_len, new_len = past_k[0].shape[2], input_ids.shape[1]
        x = self.dropout(self.pos.at(self.embed(input_ids), position_ids))
        q_slot = torch.arange(new_len, device=input_ids.device) + past_len  # (N,)
        k_slot = torch.arange(past_len + new_len, device=input_ids.device)  # (P+N,)
        causal = k_slot[None, :] <= q_slot[:, None]  # (N, P+N)
        itself = k_slot[None, :] == q_slot[:, None]
        keep = (causal[None, None] & (attention_mask != 0)[:, None, None, :]) | itself[None, None]
        present_k, present_v = [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer.forward_cached(x, past_k[i], past_v[i], keep)
            present_k.append(k)
            present_v.append(v)
        if self.norm is not None:
            x = self.norm(x)
        return self.output(x), tuple(present_k), tuple(present_v)

    def forward(self, src_ids: Tensor | None, tgt_in: Tensor) -> Tensor:
        """Next-token logits of right-padded tgt_in (B, T) -> (B, T, V); src_ids is unused."""
        batch, length = tgt_in.shape
        positions = torch.arange(length, device=tgt_in.device)[None].expand(batch, length)
        past_k, past_v = self.empty_cache(batch, self.output.weight)
        logits, _, _ = self.step(tgt_in, positions, tgt_in != self.cfg.pad_id, past_k, past_v)
        return logits


class TorchGPTStep:
    """Runs `DecoderOnlyTransformer.step` under `torch.inference_mode`."""

    def __init__(self, model: DecoderOnlyTransformer) -> None:
        self.model = model.eval()
        cfg = model.cfg
        self.max_len, self.vocab_size = cfg.max_len, cfg.tgt_vocab_size
        self.bos_id, self.eos_id, self.pad_id = cfg.bos_id, cfg.eos_id, cfg.pad_id

    def start(self, prompt_ids: np.ndarray) -> GPTState:
        """Remember right-padded prompts int64 (B, S) (S may be 0) with an empty cache."""
        prompt = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64)).reshape(
            len(prompt_ids), -1
        )
        batch = prompt.shape[0]
        past_k, past_v = self.model.empty_cache(batch, self.model.output.weight)
        empty = torch.zeros(batch, 0, dtype=torch.int64)
        return GPTState(past_k, past_v, empty, torch.zeros(batch, dtype=torch.int64), prompt)

    @torch.inference_mode()
    def step(self, state: GPTState, input_ids: np.ndarray) -> tuple[np.ndarray, GPTState]:
        """input_ids int64 (B, N) -> logits float32 (B, N, V) (the first step: N = 1, the
        logits after the whole prompt) and the extended state."""
        ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
        batch, new = ids.shape
        if state.prompt is not None:
            if new != 1:
                raise OptionsError("the first step of a GPT takes one token (<s>)")
            keep = (state.prompt != self.pad_id).long()
            ids = torch.cat([ids, state.prompt], dim=1)  # (B, 1+S)
            mask = torch.cat([torch.ones(batch, 1, dtype=torch.int64), keep], dim=1)
            positions = torch.cumsum(mask, dim=1) - 1  # pads repeat the last real position
            last = keep.sum(dim=1)  # index of each row's last real token
        else:
            mask = torch.ones(batch, new, dtype=torch.int64)
            positions = state.next_pos[:, None] + torch.arange(new)
            last = None
        if int(positions.max()) >= self.max_len:
            raise InputTooLongError(
                f"the sequence needs {int(positions.max()) + 1} positions but the model's "
                f"max_len is {self.max_len}; shorten the prompt or generate fewer tokens"
            )
        full_mask = torch.cat([state.mask, mask], dim=1)
        logits, past_k, past_v = self.model.step(
            ids, positions, full_mask, state.past_k, state.past_v
        )
        if last is not None:
            logits = logits[torch.arange(batch), last][:, None]  # (B, 1, V)
        next_pos = positions.max(dim=1).values + 1
        new_state = GPTState(past_k, past_v, full_mask, next_pos, None)
        return logits.float().numpy(), new_state

    def select(self, state: GPTState, rows: np.ndarray) -> GPTState:
        """Gather batch rows (int64 (B',), may repeat) of every tensor in the state."""
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))

        def take(tensors: Cache) -> Cache:
            return tuple(t.index_select(0, idx) for t in tensors)

        prompt = None if state.prompt is None else state.prompt.index_select(0, idx)
        return GPTState(
            take(state.past_k),
            take(state.past_v),
            state.mask.index_select(0, idx),
            state.next_pos.index_select(0, idx),
            prompt,
        )
