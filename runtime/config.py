"""`ModelConfig`: the one description of a model, shared by training, export and runtime.

It is a plain dataclass serialised as `config.json` (``indent=2, sort_keys=True``):

    cfg = ModelConfig(src_vocab_size=40, tgt_vocab_size=80)
    cfg.validate()                       # raises ConfigError naming every problem
    ModelConfig.from_json(cfg.to_json()) == cfg
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError

POSITIONAL_CHOICES = ("sinusoidal", "sinusoidal-halves", "learned", "relative")
NORM_CHOICES = ("post", "pre")
ACTIVATION_CHOICES = ("relu", "gelu", "gelu-tanh", "silu")
NORM_TYPE_CHOICES = ("layer", "rms")
FFN_CHOICES = ("plain", "gated")
ARCHITECTURE_CHOICES = ("encoder-decoder", "decoder-only", "encoder-only")


# Fields added for imported models (export/sources); omitted from to_dict() at these defaults.
IMPORT_DEFAULTS: dict[str, Any] = {"scale_embedding": True, "final_norm": None, "output_bias": None}
IMPORT_DEFAULTS |= {"source_bos": False, "decoder_start_id": None}
IMPORT_FIELDS = tuple(IMPORT_DEFAULTS)
# Block options (T5 v1.1's RMS norm and gated feed-forward, BART's norm of the embeddings);
# omitted at these defaults too.
BLOCK_DEFAULTS: dict[str, Any] = {"norm_type": "layer", "ffn": "plain", "embedding_norm": False}
# positional "relative" (T5's bucketed relative position bias); omitted at these defaults.
BLOCK_DEFAULTS |= {"relative_buckets": 32, "relative_max_distance": 128}
BLOCK_DEFAULTS |= {"head_dim": None}  # heads of another width than d_model / n_heads
OPTIONAL_DEFAULTS = {**IMPORT_DEFAULTS, **BLOCK_DEFAULTS}

# Positional "relative" has no table: a cap only so that a runaway input or generation is
# refused before memory runs out (one (B, H, T, dh) cache per layer grows with it).
RELATIVE_MAX_POSITIONS = 65_536
MIN_MAX_LEN = 4  # the export traces past_len 2 + new_len 2 (runtime: past_len + new_len <= max_len)


@dataclass
class ModelConfig:
    """Hyper-parameters of a Transformer: encoder–decoder, decoder-only (GPT) or encoder-only
    (BERT). A decoder-only model has `n_decoder_layers` blocks and one vocabulary
    (src_vocab_size == tgt_vocab_size); an encoder-only model has `n_encoder_layers` blocks
    over src_vocab_size tokens and a classification head over tgt_vocab_size labels."""

    src_vocab_size: int  # rows of the source embedding
    tgt_vocab_size: int  # rows of the target embedding = columns of the output projection
    d_model: int = 256  # width of every residual stream
    n_heads: int = 4  # attention heads; d_model must be divisible by it unless head_dim is set
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024  # hidden width of the position-wise feed-forward network
    dropout: float = 0.1  # applied in training only
    max_len: int = 256  # rows of the positional table = longest source or target sequence
    positional: str = "sinusoidal"  # "sinusoidal" (the paper's, sin/cos interleaved) |
    # "sinusoidal-halves" (Marian's: [sin half | cos half]) | "learned" (any table, stored) |
    # "relative" (T5's: no table; a learned bias per head and distance bucket added to the
    # self-attention scores, docs/blocks.md; encoder-decoder only)
    norm: str = "post"  # "post": x = LN(x + f(x)) as in the paper | "pre": x = x + f(LN(x))
    activation: str = "relu"  # FFN non-linearity: "relu" | "gelu" (erf) | "gelu-tanh" (its
    # tanh approximation, T5 v1.1's gelu_new) | "silu" (Marian's swish)
    tie_output: bool = False  # output projection shares the target embedding matrix
    layer_norm_eps: float = 1e-5
    pad_id: int = 0  # special token ids (the same in source and target vocabularies)
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3
    architecture: str = "encoder-decoder"  # | "decoder-only" (GPT) | "encoder-only" (BERT)
    # Fields for imported models (encoder-decoder only). to_dict() omits them at their
    # defaults, so the config.json of a model that does not use them is unchanged.
    scale_embedding: bool = True  # token embeddings x sqrt(d_model) (nn.Transformer users may not)
    final_norm: bool | None = None  # LayerNorm after each stack; None: in pre-norm only
    output_bias: bool | None = None  # output projection has a bias; None: when not tie_output
    source_bos: bool = False  # sources are `<s> tokens </s>` (BART's), not `tokens </s>`
    # the token the decoder is fed first; None: bos_id. fairseq-numbered imports (M2M-100,
    # NLLB, BART, mBART-50) start from </s>, so a generated <s> keeps its own embedding
    decoder_start_id: int | None = None
    # Block options (docs/blocks.md), encoder-decoder only; omitted by to_dict() at defaults.
    norm_type: str = "layer"  # every norm: "layer" (LayerNorm) | "rms" (x / rms(x) * w, T5's)
    ffn: str = "plain"  # "plain": W2 act(W1 x) | "gated": W2 (act(W1 x) * W3 x), T5 v1.1's
    embedding_norm: bool = False  # a norm (norm_type) on token embedding + position, in the
    # encoder and the decoder, before dropout: BART / mBART's layernorm_embedding
    relative_buckets: int = 32  # positional "relative": distance buckets per stack (even, >= 4)
    relative_max_distance: int = 128  # positional "relative": distances beyond share one bucket
    head_dim: int | None = None  # width of each head (T5's d_kv); None: d_model / n_heads

    @property
    def d_head(self) -> int:
        """Width of one attention head: head_dim, by default d_model / n_heads."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def max_positions(self) -> int:
        """Positions a source or a target may use: max_len, the rows of the positional
        table, or for positional "relative" (T5's: no table; distances past
        relative_max_distance share one bucket) RELATIVE_MAX_POSITIONS, as transformers lets
        T5 run past n_positions. max_len stays the default budget of a generation."""
        return RELATIVE_MAX_POSITIONS if self.positional == "relative" else self.max_len

    @property
    def has_final_norm(self) -> bool:
        """Whether each stack ends with a LayerNorm: `final_norm`, by default in pre-norm."""
        return self.norm == "pre" if self.final_norm is None else self.final_norm

    @property
    def start_id(self) -> int:
        """The token the decoder is fed first: `decoder_start_id`, by default `bos_id`."""
        return self.bos_id if self.decoder_start_id is None else self.decoder_start_id

    @property
    def has_output_bias(self) -> bool:
        """Whether the output projection adds a bias: `output_bias`, by default when untied."""
        return not self.tie_output if self.output_bias is None else self.output_bias

    def problems(self) -> list[str]:
        """Every problem with this configuration, as readable sentences (empty when valid)."""
        out: list[str] = []
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                out.append(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.max_len, int) and 0 < self.max_len < MIN_MAX_LEN:
            out.append(
                f"max_len must be at least {MIN_MAX_LEN} (<s>, a token or two and </s>; the "
                f"export traces 2 cached + 2 new positions), got {self.max_len}"
            )
        for name in ("n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                out.append(f"{name} must be an integer >= 1, got {value!r}")
        if (
            isinstance(self.d_model, int)
            and isinstance(self.n_heads, int)
            and self.n_heads > 0
            and self.d_model % self.n_heads != 0
            and self.head_dim is None
        ):
            out.append(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                "or head_dim set"
            )
        head_dim = self.head_dim
        if head_dim is not None and (
            not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0
        ):
            out.append(f"head_dim must be a positive integer or null, got {head_dim!r}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            out.append(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            out.append(f"layer_norm_eps must be positive, got {self.layer_norm_eps!r}")
        for name, choices in (
            ("positional", POSITIONAL_CHOICES),
            ("norm", NORM_CHOICES),
            ("activation", ACTIVATION_CHOICES),
            ("architecture", ARCHITECTURE_CHOICES),
            ("norm_type", NORM_TYPE_CHOICES),
            ("ffn", FFN_CHOICES),
        ):
            if getattr(self, name) not in choices:
                out.append(
                    f"{name} must be one of {', '.join(choices)}; got {getattr(self, name)!r}"
                )
        out += self._relative_problems()
        if self.architecture == "decoder-only" and self.src_vocab_size != self.tgt_vocab_size:
            out.append(
                "a decoder-only model has one vocabulary: src_vocab_size "
                f"({self.src_vocab_size}) must equal tgt_vocab_size ({self.tgt_vocab_size})"
            )
        if self.architecture == "encoder-only" and self.tie_output:
            out.append("tie_output needs a decoder; an encoder-only model's head has labels")
        if not isinstance(self.tie_output, bool):
            out.append(f"tie_output must be true or false, got {self.tie_output!r}")
        if not isinstance(self.source_bos, bool):
            out.append(f"source_bos must be true or false, got {self.source_bos!r}")
        if not isinstance(self.embedding_norm, bool):
            out.append(f"embedding_norm must be true or false, got {self.embedding_norm!r}")
        if not isinstance(self.scale_embedding, bool):
            out.append(f"scale_embedding must be true or false, got {self.scale_embedding!r}")
        for name in ("final_norm", "output_bias"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                out.append(f"{name} must be true, false or null, got {getattr(self, name)!r}")
        changed = [
            name for name, default in OPTIONAL_DEFAULTS.items() if getattr(self, name) != default
        ]
        if self.architecture != "encoder-decoder" and changed:
            out.append(
                f"{', '.join(changed)} apply to the encoder-decoder only; a "
                f"{self.architecture} model takes their defaults"
            )
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        ids["unk_id"] = self.unk_id
        smallest = min(
            (v for v in (self.src_vocab_size, self.tgt_vocab_size) if isinstance(v, int)),
            default=0,
        )
        for name, value in ids.items():
            if not isinstance(value, int) or value < 0 or (smallest and value >= smallest):
                out.append(f"{name} must be an id below both vocabulary sizes, got {value!r}")
        if len(set(ids.values())) != len(ids):
            out.append(f"special token ids must be distinct, got {ids}")
        start = self.decoder_start_id
        tgt = self.tgt_vocab_size if isinstance(self.tgt_vocab_size, int) else 0
        if start is not None and (
            not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < tgt
        ):
            out.append(f"decoder_start_id must be null or a target id, got {start!r}")
        return out

    def _relative_problems(self) -> list[str]:
        """The problems of the relative position fields (positional "relative")."""
        out: list[str] = []
        buckets, distance = self.relative_buckets, self.relative_max_distance
        if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 4 or buckets % 2:
            out.append(f"relative_buckets must be an even integer >= 4, got {buckets!r}")
        elif not isinstance(distance, int) or isinstance(distance, bool) or distance < buckets:
            out.append(
                f"relative_max_distance must be an integer >= relative_buckets ({buckets}), "
                f"got {distance!r}"
            )
        if self.positional != "relative" and (
            buckets != BLOCK_DEFAULTS["relative_buckets"]
            or distance != BLOCK_DEFAULTS["relative_max_distance"]
        ):
            out.append(
                "relative_buckets and relative_max_distance apply to positional relative only"
            )
        if self.positional == "relative" and self.architecture != "encoder-decoder":
            out.append(
                f"positional relative applies to the encoder-decoder only, not {self.architecture}"
            )
        return out

    def validate(self) -> ModelConfig:
        """Raise one `ConfigError` naming every problem; return self when valid."""
        problems = self.problems()
        if problems:
            raise ConfigError(
                "invalid model config: " + "; ".join(problems) + ". Fix the recipe or config.json."
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field, less the import fields and block options
        (OPTIONAL_DEFAULTS) at their defaults: a model that does not use them keeps the
        config.json it always had."""
        data = asdict(self)
        for name, default in OPTIONAL_DEFAULTS.items():
            if type(data[name]) is type(default) and data[name] == default:  # not 1 for True
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from a dict; unknown or missing keys raise `ConfigError`."""
        if not isinstance(data, dict):
            raise ConfigError(f"a model config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown model config keys: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        missing = [k for k in ("src_vocab_size", "tgt_vocab_size") if k not in data]
        if missing:
            raise ConfigError(f"model config lacks required keys: {', '.join(missing)}")
        return cls(**data)

    def to_json(self) -> str:
        """JSON text, `indent=2, sort_keys=True`."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        """Parse JSON text written by `to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model config is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        """Write `config.json`-style JSON to `path`."""
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Read and validate a config file."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"model config {path} does not exist")
        return cls.from_json(path.read_text(encoding="utf-8")).validate()
