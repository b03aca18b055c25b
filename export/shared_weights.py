"""One copy of each weight while parity holds both our model and the source model.

    saved = adopt_equal_tensors(model, reference_module)    # bytes no longer held twice

An import's parity against its source (export/kinds/seq2seq/source_parity.py) runs the
source model beside our re-implementation, whose weights the adapter copied from the same
checkpoint: two copies of every weight (2.5 GB each for NLLB-200-600M). transformers maps the
checkpoint's safetensors file instead of reading it into the heap, so its weights cost
nothing until a forward pass touches them. Every parameter and buffer of ours equal to one of
the source's becomes a view of the source's tensor, and ours is freed: both models then read
the same pages. A tensor the adapter changed (a token table whose rows edgeseq renumbers, a
fused or scaled weight) has no equal and keeps its own copy. Values do not change, so
neither do the computations parity compares.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

FINGERPRINT_POINTS = 16  # elements compared before the whole tensor is


def _fingerprint(tensor: Tensor) -> tuple:
    """Shape, dtype and FINGERPRINT_POINTS elements spread over `tensor`: equal tensors share
    it, and two weights of a trained or random model almost never do."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return (tuple(tensor.shape), tensor.dtype)
    index = torch.arange(FINGERPRINT_POINTS) * (flat.numel() - 1) // (FINGERPRINT_POINTS - 1)
    return (tuple(tensor.shape), tensor.dtype, tuple(flat[index].tolist()))


def _slots(module: nn.Module) -> Iterator[tuple[dict, str, Tensor]]:
    """(table, name, tensor) of every parameter and buffer slot of every submodule: a tied
    tensor appears once per module that holds it."""
    for owner in module.modules():
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is not None:
                    yield table, name, tensor


@torch.no_grad()
def adopt_equal_tensors(model: nn.Module, source: nn.Module) -> int:
    """Make every parameter and buffer of `model` that equals (shape, dtype and every value)
    a tensor of `source` share that tensor's storage, in every module that holds it; return
    the bytes `model` no longer holds apart. Both must be on the CPU and used for inference
    only (a write through one would change the other)."""
    theirs: dict[tuple, list[Tensor]] = {}
    for _, _, tensor in _slots(source):
        if tensor.device.type == "cpu" and tensor.numel():
            theirs.setdefault(_fingerprint(tensor), []).append(tensor)
    replacement: dict[int, Tensor] = {}
    saved = 0
    for _, _, tensor in _slots(model):
        if id(tensor) in replacement or tensor.device.type != "cpu" or not tensor.numel():
            continue
        candidates = theirs.get(_fingerprint(tensor), [])
        match = next((c for c in candidates if torch.equal(c, tensor)), None)
        if match is None or match.data_ptr() == tensor.data_ptr():
            continue
        shared = match.detach()
        if isinstance(tensor, nn.Parameter):
            shared = nn.Parameter(shared, requires_grad=tensor.requires_grad)
        replacement[id(tensor)] = shared
        saved += tensor.numel() * tensor.element_size()
    for table, name, tensor in list(_slots(model)):
        if id(tensor) in replacement:
            table[name] = replacement[id(tensor)]
    return saved
