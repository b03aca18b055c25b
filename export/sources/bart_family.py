"""What the adapters of fairseq-numbered Hugging Face families share (M2M-100 / NLLB in
m2m_100.py, BART and mBART-50 in mbart.py): their `<s>` 0 `<pad>` 1 `</s>` 2 `<unk>` 3 ids,
the config.json checks, a weight reader that refuses unused weights, and the reference over
transformers' own model.

    config = read_hf_config(path, ("mbart", "bart"), "mbart", BART_DEFAULTS)
    weights = FairseqWeights(state, "BART")  # weights.take(key); weights.check_all_used(tied)
    model = fill_model(cfg, config, weights, (src_positions, tgt_positions))
    table[source_rows(vocab)]                # a source table's rows in edgeseq ids
    reference = SwappedReference(path, "BartForConditionalGeneration", ())

Ids: the source's `<s>` 0 and `<pad>` 1 swap places so that edgeseq's `<pad>` `<s>` `</s>`
`<unk>` are 0..3; every other id is unchanged. These families start decoding from `</s>`
(decoder_start_token_id): the bundle's `decoder_start_id` is `</s>` (`START_ID`), and every
table keeps the source's rows, so a `<s>` the model generates mid-output is embedded as the
source embeds it and decoding goes on as transformers' does; an output projection tied to
the shared table in the source (`tie_word_embeddings`) stays tied, one table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from edgeseq.build_model.model import Seq2SeqTransformer
from edgeseq.runtime.config import ModelConfig
from edgeseq.runtime.tokenizer import TokenizerPair

from . import SourceError, SourceModel
from .generation_config import parity_generate_kwargs, read_generation
from .hf_checkpoint import check_stacks, check_written, empty_model, read_typed_config, weights_file
from .marian import DECODER_MAP, ENCODER_MAP

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu-tanh"}
ACTIVATIONS |= {"swish": "silu", "silu": "silu"}
TABLE_KEYS = ("model.shared.weight", "model.encoder.embed_tokens.weight")
TABLE_KEYS += ("model.decoder.embed_tokens.weight",)


def read_hf_config(
    path: Path, model_types: tuple[str, ...], adapter: str, defaults: dict[str, Any]
) -> dict[str, Any]:
    """config.json with `defaults` under it, refused unless its model_type is one of
    `model_types` and its stacks, activation and ids map onto edgeseq's blocks."""
    config = defaults | read_typed_config(path, model_types, adapter)
    check_stacks(config, ACTIVATIONS)
    start, eos = config["decoder_start_token_id"], config["eos_token_id"]
    if start != eos:
        raise SourceError(
            f"config.json decoder_start_token_id {start} is not </s> ({eos}): not mapped "
            "(edgeseq maps a start from </s>)"
        )
    if (config["pad_token_id"], eos) != (1, 2):
        raise SourceError(
            f"config.json pad_token_id {config['pad_token_id']} / eos_token_id {eos} are not "
            "fairseq's 1 / 2: not mapped"
        )
    return config


START_ID = 2  # edgeseq's id of the source's decoder start, </s> (2 in both numberings)


def source_rows(size: int) -> Tensor:
    """The source's id of each edgeseq id 0..size-1: `<s>` 0 and `<pad>` 1 swapped."""
    rows = torch.arange(size)
    rows[0], rows[1] = 1, 0
    return rows


def swap_ids(ids: Tensor) -> Tensor:
    """edgeseq ids <-> the source's (the swap of 0 and 1 is its own inverse)."""
    out = ids.clone()
    out[ids == 0], out[ids == 1] = 1, 0
    return out


class FairseqWeights:
    """A state_dict of a fairseq-numbered family, read by name; remembers which keys the map
    used. `family` names the map in refusals."""

    def __init__(self, state: dict[str, Tensor], family: str) -> None:
        self.state, self.used, self.family = state, set(), family
        self.table_key = next((k for k in TABLE_KEYS if k in state), TABLE_KEYS[0])

    def take(self, key: str) -> Tensor:
        """The tensor `key`, marked used; SourceError when the weights lack it."""
        if key not in self.state:
            raise SourceError(f"the weights lack {key}")
        self.used.add(key)
        return self.state[key]

    def take_table(self, rows: int) -> Tensor:
        """The shared token table (rows, D)."""
        table = self.take(self.table_key)
        if table.shape[0] != rows:
            raise SourceError(f"{self.table_key} has {table.shape[0]} rows; config.json: {rows}")
        return table

    def check_all_used(self, tied: bool) -> None:
        """Refuse weights the map did not use, except copies of the shared table."""
        aliases = set(TABLE_KEYS) | ({"lm_head.weight"} if tied else set())
        for key in sorted(set(self.state) - self.used):
            if key not in aliases:
                raise SourceError(
                    f"the weights hold {key}, which the {self.family} map does not use"
                )
            if not torch.equal(self.state[key], self.state[self.table_key]):
                raise SourceError(f"the weights' {key} differs from {self.table_key}")


def fill_model(
    cfg: ModelConfig,
    config: dict[str, Any],
    weights: FairseqWeights,
    positions: tuple[Tensor, Tensor],
) -> Seq2SeqTransformer:
    """A Seq2SeqTransformer of `cfg` (eval) holding `weights` in edgeseq ids: the shared table
    with `<s>`/`<pad>` swapped (the target's `<s>` row is the decoder start's), `positions`
    (two (max_len, D): the encoder's, the decoder's), the layers, and where `cfg` has them
    the final norms (`model.*.layer_norm`), the embedding norms (`model.*.layernorm_embedding`)
    and the output bias (`final_logits_bias`)."""
    vocab = config["vocab_size"]
    table = weights.take_table(vocab)
    model = empty_model(cfg)  # the stacks share the source's one table
    params = dict(model.named_parameters())
    norms = {"norm": "layer_norm"} if cfg.has_final_norm else {}
    norms |= {"embed_norm": "layernorm_embedding"} if cfg.embedding_norm else {}
    written = {"src_embed.weight"}

    def put(name: str, value: Tensor) -> None:
        params[name].copy_(value)
        written.add(name)

    with torch.no_grad():
        torch.index_select(table, 0, source_rows(vocab), out=params["src_embed.weight"])
        put("src_pos.table", positions[0])
        put("tgt_pos.table", positions[1])
        for side, short, layers, mapping in (
            ("encoder", "src", cfg.n_encoder_layers, ENCODER_MAP),
            ("decoder", "tgt", cfg.n_decoder_layers, DECODER_MAP),
        ):
            for i in range(layers):
                for ours, theirs in mapping.items():
                    for kind in ("weight", "bias"):
                        value = weights.take(f"model.{side}.layers.{i}.{theirs}.{kind}")
                        put(f"{side}_layers.{i}.{ours}.{kind}", value)
            for ours, theirs in norms.items():
                name = f"{side}_{ours}" if ours == "norm" else f"{short}_{ours}"
                for kind in ("weight", "bias"):
                    put(f"{name}.{kind}", weights.take(f"model.{side}.{theirs}.{kind}"))
        if not cfg.tie_output:  # tied: the target embedding is the output projection
            put("output.weight", weights.take("lm_head.weight")[source_rows(vocab)])
        if cfg.has_output_bias:
            put("output.bias", weights.take("final_logits_bias").reshape(-1)[source_rows(vocab)])
    check_written(model, written)
    return model.eval()


def swapped_source(
    path: Path,
    name: str,
    family: str,
    model: Seq2SeqTransformer,
    tokenizer: Any,
    checked: str,
    pad_rows: int,
    reference: SwappedReference,
    languages: dict[str, Any] | None,
) -> SourceModel:
    """The SourceModel of adapter `name` for a checkpoint of `family` (one shared tokenizer;
    `checked` says how its ids were checked, `pad_rows` how many ids were added)."""
    description = f"Hugging Face {family} checkpoint {path} (tokenizer: {checked})"
    if pad_rows:
        description += f" ({pad_rows} embedding rows without a token)"
    tokenizers = TokenizerPair(tokenizer, tokenizer)
    weights = (weights_file(path),)
    # read_hf_config holds these families to <pad> 1 and </s> 2; the target language
    # (forced_bos_token_id) is the languages' business when the model has them
    swap = {0: 1, 1: 0}
    handled = ("forced_bos_token_id",) if languages else ()
    generation = read_generation(path, lambda i: swap.get(i, i), 2, handled=handled)
    return SourceModel(
        model, tokenizers, None, name, description, reference, weights, languages=languages,
        generation=generation,
    )  # fmt: skip


def check_tokenizer(
    path: Path, tokenizer: Any, prefix: list[int], source_lang: str | None = None
) -> str:
    """Refuse a converted tokenizer whose ids differ from transformers' tokenizer of the
    checkpoint on CHECK_TEXTS (`prefix` tokens </s>, edgeseq ids); say how many matched (or
    why nothing was checked)."""
    from .m2m_100_tokenizer import CHECK_TEXTS

    try:
        from transformers import AutoTokenizer
    except ImportError:
        return "not checked, transformers is not installed"
    language = {"src_lang": source_lang} if source_lang else {}
    source = AutoTokenizer.from_pretrained(path, local_files_only=True, **language)
    matched = 0
    for text in CHECK_TEXTS:
        want = swap_ids(torch.tensor(source(text).input_ids, dtype=torch.int64)).tolist()
        matched += want == [*prefix, *tokenizer.encode(text), tokenizer.eos_id]
    if matched != len(CHECK_TEXTS):
        raise SourceError(
            f"the converted tokenizer gives transformers' ids on {matched} of "
            f"{len(CHECK_TEXTS)} check texts only: report it with the checkpoint's tokenizer files"
        )
    return f"ids equal to transformers' on {matched}/{len(CHECK_TEXTS)} check texts"


class SwappedReference:
    """`SourceReference` over a transformers seq2seq class (`model_class`, e.g.
    "M2M100ForConditionalGeneration"), in edgeseq ids (loaded when first used).
    `target_prefix`: the tokens forced first (edgeseq ids; a target language, or none)."""

    def __init__(self, path: Path, model_class: str, target_prefix: tuple[int, ...]) -> None:
        self.path, self.model_class, self.target_prefix = path, model_class, target_prefix
        self._model: Any = None

    @property
    def model(self) -> Any:
        """The model of the directory, eval mode."""
        if self._model is None:
            import transformers

            cls = getattr(transformers, self.model_class)
            self._model = cls.from_pretrained(self.path, local_files_only=True).eval()
        return self._model

    @torch.inference_mode()
    def logits(self, src_ids: Any, tgt_in: Any) -> Tensor:
        """src_ids int64 (B, S) right-padded, tgt_in int64 (B, T) from the start token,
        edgeseq ids (torch or numpy) -> float32 (B, T, V) in edgeseq ids. The leading token
        is read as the source's decoder start `</s>` whatever it is."""
        src = torch.as_tensor(src_ids, dtype=torch.int64)
        tgt = swap_ids(torch.as_tensor(tgt_in, dtype=torch.int64))
        tgt[:, 0] = self.model.config.decoder_start_token_id
        out = self.model(
            input_ids=swap_ids(src), attention_mask=(src != 0).long(), decoder_input_ids=tgt
        ).logits  # right pads of tgt sit behind the causal mask
        return out[..., source_rows(out.shape[-1])].float()

    @torch.inference_mode()
    def generate(
        self, sources: list[list[int]], beam_size: int, max_new_tokens: int
    ) -> list[list[int]]:
        """The source's generate for `sources` (edgeseq ids ending with `</s>`) with
        `target_prefix` forced first, in edgeseq ids without the start token and `</s>`."""
        width = max(map(len, sources))
        src = torch.tensor([list(s) + [0] * (width - len(s)) for s in sources])
        forced = {}
        if self.target_prefix:
            forced["forced_bos_token_id"] = int(swap_ids(torch.tensor(self.target_prefix[:1]))[0])
        out = self.model.generate(
            input_ids=swap_ids(src),
            attention_mask=(src != 0).long(),
            **forced,
            **parity_generate_kwargs(beam_size, max_new_tokens),
        )
        eos = self.model.config.eos_token_id
        rows = []
        for row in out[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            rows.append(swap_ids(torch.tensor(row, dtype=torch.int64)).tolist() if row else [])
        return rows
