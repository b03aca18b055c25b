"""The torch adapter: a user's `torch.nn.Transformer` model, exported without rewriting it.

    source = load(Path("torch_source.json"))   # or a directory holding torch_source.json
    source = load(Path("."), mapping={...})    # the same keys as a dict; factory: a callable too

The model is the classic PyTorch translation tutorial's shape: token embeddings, an absolute
positional table added to them, a `torch.nn.Transformer`, an output `nn.Linear`. The mapping
(JSON; relative paths are relative to its directory) names its parts:

    {
      "factory": "model.py:build",         # "path/to/model.py:build" (from this directory) or
                                           #   "pkg.module:build" importable from the cwd
      "factory_kwargs": {},                # optional keyword arguments of the factory
      "weights": "model.safetensors",      # .safetensors, or a torch file that
                                           #   torch.load(weights_only=True) reads (no pickles)
      "weights_key": null,                 # optional: the state_dict's key inside a torch file
      "transformer": "transformer",        # the torch.nn.Transformer submodule
      "source_embedding": "src_tok_emb",   # ids -> vectors: an nn.Embedding or a module
      "target_embedding": "tgt_tok_emb",   #   holding one (V, D) table (may scale it)
      "positional": "positional_encoding", # a module adding a table to its input, a table
                                           #   ("module.buffer"), an nn.Embedding of positions
                                           #   or "none"; "source_positional" and
                                           #   "target_positional" name one per side
      "generator": "generator",            # the output nn.Linear (tied or not)
      "scale_embedding": true,             # optional: embeddings entering the positions are
                                           #   the table rows x sqrt(d_model); default: what
                                           #   the embedding module does by itself
      "source_vocab": "src_vocab.txt",     # one token per line (id = line number) or a
      "target_vocab": "tgt_vocab.txt",     #   `tokenizers` JSON; target absent: shared
      "special_tokens": {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"},
      "max_len": 256                       # optional: positions kept (default: the table's)
    }

The user's forward is never called (its signature is the user's); the parts are composed as
the tutorial's forward does, in the transformer's layout (batch_first or not), in eval mode:

    x = positional(embedding(ids) [x sqrt(d_model) when scale_embedding and not done inside])
    logits = generator(transformer(src_x, tgt_x, tgt_mask=causal, src/tgt/memory padding masks))

`reference.logits` runs exactly that on the user's own modules, so parity proves the weight
map. Weights map onto `Seq2SeqTransformer`: each nn.MultiheadAttention's packed
in_proj_weight/bias splits into w_q/w_k/w_v, out_proj -> w_o, linear1/linear2 -> ffn,
norm1/2(/3) -> the sublayer norms, the stacks' final norms -> encoder_norm/decoder_norm
(ModelConfig.final_norm), norm_first -> pre-norm. bias=False maps exactly onto zero biases
(and a LayerNorm without affine onto ones and zeros).

Vocabularies: edgeseq's runtime needs `<pad>` `<s>` `</s>` `<unk>` at ids 0..3, so the user's
vocabulary is renumbered: its four special tokens (named in special_tokens) first, renamed
to edgeseq's, then every other token in its own order; embedding rows, output rows and the
output bias are permuted alike. A token list becomes a "word" tokenizer (whitespace-separated
tokens, decoded joined by spaces: a list holds no rules for splitting text, so input must be
pre-tokenized as the user's pipeline did); a `tokenizers` JSON keeps its model, normalizer,
pre-tokenizer and decoder with the ids renumbered (its post-processor is dropped: edgeseq adds
`<s>`/`</s>` itself). The reference translates edgeseq ids to the user's and back.

Refused, with one line naming the part: an attention module that is not nn.MultiheadAttention
(or has add_bias_kv, add_zero_attn, kdim/vdim != d_model), an activation other than ReLU, exact
GELU or SiLU, a positional module that does not add a fixed table (rotary, scaled, learned
relative), an embedding that is not a lookup of one table times 1 or sqrt(d_model) (or has
max_norm), vocabulary sizes that differ from the weights, special tokens missing from a
vocabulary, a state_dict that does not fit the module (the first missing or unexpected key).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from edgeseq.runtime.tokenizer import TokenizerPair

from . import SourceError, SourceModel
from .renumber import Vocabulary, read_vocabulary
from .torch_map import Parts, our_model

NAME = "torch"
MAPPING_FILE = "torch_source.json"  # the mapping's name when `load` is given a directory
REQUIRED = ("factory", "weights", "transformer", "source_embedding", "target_embedding")
REQUIRED += ("generator", "source_vocab", "special_tokens")
OPTIONAL = ("factory_kwargs", "weights_key", "positional", "source_positional")
OPTIONAL += ("target_positional", "scale_embedding", "target_vocab", "max_len")


def detect(path: Path) -> bool:
    """A mapping file (JSON with "factory" and "transformer") or a directory holding one."""
    path = path / MAPPING_FILE if path.is_dir() else path
    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "factory" in data and "transformer" in data


def load(path: Path, mapping: dict[str, Any] | None = None, **overrides: Any) -> SourceModel:
    """The user's model as a `Seq2SeqTransformer` (eval, CPU) with renumbered vocabularies and
    a reference running the user's modules. `path`: the mapping file, or a directory holding
    MAPPING_FILE (or, with `mapping`, the directory its relative paths start from);
    `overrides` replace mapping keys."""
    mapping, base = _read_mapping(Path(path), mapping)
    mapping.update(overrides)
    missing = [key for key in REQUIRED if key not in mapping]
    if missing:
        raise SourceError(f"torch mapping lacks {', '.join(missing)}")
    unknown = sorted(set(mapping) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise SourceError(f"torch mapping has unknown keys {', '.join(unknown)}")
    module = _build_module(mapping, base)
    parts = Parts.find(module, mapping)
    src_vocab = _read_vocabulary(mapping, base, "source_vocab")
    tgt_vocab = src_vocab
    if mapping.get("target_vocab") and mapping["target_vocab"] != mapping["source_vocab"]:
        tgt_vocab = _read_vocabulary(mapping, base, "target_vocab")
    model = our_model(parts, src_vocab, tgt_vocab, mapping)
    source_tok = src_vocab.tokenizer()
    target_tok = source_tok if tgt_vocab is src_vocab else tgt_vocab.tokenizer()
    reference = TorchReference(parts, src_vocab, tgt_vocab)
    what = mapping["factory"] if isinstance(mapping["factory"], str) else "a factory"
    description = f"torch.nn.Transformer model from {what} with weights {mapping['weights']}"
    tokenizers = TokenizerPair(source_tok, target_tok)
    weights = (base / mapping["weights"],)
    return SourceModel(model, tokenizers, None, NAME, description, reference, weights)


# -- reading the mapping, the module and its weights ------------------------------------------
def _read_mapping(path: Path, mapping: dict[str, Any] | None) -> tuple[dict[str, Any], Path]:
    """The mapping as a dict and the directory its relative paths start from."""
    if mapping is not None:
        return dict(mapping), path if path.is_dir() else path.parent
    file = path / MAPPING_FILE if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SourceError(f"cannot read torch mapping {file}: {exc.strerror}") from None
    except ValueError as exc:
        raise SourceError(f"torch mapping {file} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SourceError(f"torch mapping {file} must be a JSON object")
    return data, file.parent


def _build_module(mapping: dict[str, Any], base: Path) -> nn.Module:
    """Call the factory, load the weights (strict, tied aliases allowed), eval mode."""
    factory = mapping["factory"]
    if not callable(factory):
        factory = _import_factory(str(factory), base)
    module = factory(**mapping.get("factory_kwargs", {}))
    if not isinstance(module, nn.Module):
        raise SourceError(f"factory {mapping['factory']} returned {type(module).__name__}")
    state = _read_weights(base / mapping["weights"], mapping.get("weights_key"))
    own = module.state_dict(keep_vars=True)
    unexpected = [key for key in state if key not in own]
    if unexpected:
        raise SourceError(f"weights do not fit the module: unexpected key {unexpected[0]}")
    present = {id(own[key]) for key in state}
    missing = [key for key in own if key not in state and id(own[key]) not in present]
    if missing:  # a key whose tensor is another (present) key's (a tied weight) is no miss
        raise SourceError(f"weights do not fit the module: missing key {missing[0]}")
    try:
        module.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[-1].strip()
        raise SourceError(f"weights do not fit the module: {first}") from None
    return module.eval()


def _import_factory(spec: str, base: Path) -> Callable[..., Any]:
    """The function named by "pkg.module:build" (imported with the current directory on
    sys.path) or "path/file.py:build" (relative to the mapping's directory; its own directory
    is on sys.path while it is imported)."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise SourceError(f"factory {spec!r} must be 'pkg.module:function' or 'file.py:function'")
    file = base / where
    if where.endswith(".py") and not file.is_file():
        raise SourceError(f"factory file {file} does not exist")
    sys.path.insert(0, str(file.parent if where.endswith(".py") else Path.cwd()))
    try:
        if where.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(f"_user_{file.stem}", file)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as exc:
        raise SourceError(f"cannot import factory {where}: {exc}") from None
    finally:
        del sys.path[0]
    if not callable(getattr(module, name, None)):
        raise SourceError(f"factory module {where} has no function {name}")
    return getattr(module, name)


def _read_weights(path: Path, key: str | None) -> dict[str, Tensor]:
    """A state_dict from .safetensors or torch.load(weights_only=True) (never unpickling)."""
    if not path.is_file():
        raise SourceError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            state: Any = load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types
            raise SourceError(f"cannot read weights {path}: {exc}") from None
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # pickle errors of many kinds
            raise SourceError(
                f"weights {path} cannot be read with torch.load(weights_only=True): save "
                f"model.state_dict() or safetensors ({str(exc).splitlines()[0]})"
            ) from None
    if key is not None:
        if not isinstance(state, dict) or key not in state:
            raise SourceError(f"weights {path} have no key {key!r} (weights_key)")
        state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise SourceError(f"weights {path} are not a state_dict of tensors; set weights_key")
    return state


def _read_vocabulary(mapping: dict[str, Any], base: Path, key: str) -> Vocabulary:
    specials = mapping["special_tokens"]
    if not isinstance(specials, dict):
        raise SourceError("special_tokens must map pad, bos, eos, unk to the vocabulary's tokens")
    return read_vocabulary(base / mapping[key], specials)


# -- the reference: the user's modules, in edgeseq ids ---------------------------------------------
class TorchReference:
    """`SourceReference` over the user's modules: ids translated to the user's numbering,
    logits columns back to edgeseq's. No generation of its own (parity decodes greedily)."""

    def __init__(self, parts: Parts, src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> None:
        self.parts = parts
        self.src_to_user = torch.as_tensor(src_vocab.to_source)
        self.tgt_to_user = torch.as_tensor(tgt_vocab.to_source)
        self.src_pad, self.tgt_pad = src_vocab.specials["pad"], tgt_vocab.specials["pad"]

    @torch.inference_mode()
    def logits(self, src_ids: Any, tgt_in: Any) -> Tensor:
        """src_ids int64 (B, S), tgt_in int64 (B, T) in edgeseq ids (torch or numpy) ->
        float32 logits (B, T, V) in edgeseq ids, a CPU tensor."""
        p = self.parts
        src = self.src_to_user[torch.as_tensor(src_ids, dtype=torch.int64)]
        tgt = self.tgt_to_user[torch.as_tensor(tgt_in, dtype=torch.int64)]
        src_pad = src == self.src_pad  # (B, S)
        if not p.batch_first:
            src, tgt = src.T, tgt.T  # (S, B), (T, B)
        src_x = p.src_pos.add(p.src_embed(src), p.batch_first)
        tgt_x = p.tgt_pos.add(p.tgt_embed(tgt), p.batch_first)
        length = tgt.shape[1] if p.batch_first else tgt.shape[0]
        causal = torch.ones(length, length, dtype=torch.bool).triu(1)  # True: hidden
        # No target key padding mask, as the tutorial's greedy decoding: right pads sit
        # behind the causal mask, and a generated <pad> stays visible, as in the graphs' cache.
        out = p.transformer(
            src_x, tgt_x, tgt_mask=causal,
            src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad,
        )  # fmt: skip
        logits = p.generator(out if p.batch_first else out.transpose(0, 1))  # (B, T, V_user)
        return logits[..., self.tgt_to_user].float()

    def generate(
        self, sources: list[list[int]], beam_size: int, max_new_tokens: int
    ) -> list[list[int]] | None:
        """None: an nn.Transformer model has no generation of its own."""
        return None
