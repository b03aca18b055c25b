"""The form on disk of an output projection that reads the token table: blocks of rows.

A tied projection exports as `MatMul(x, Transpose(W))`, W the (vocab, D) table the token
`Gather` reads too. onnxruntime folds that Transpose when it opens the graph: it writes W's
transpose into its heap (and prepacks it), while the whole of W is read. For NLLB-200's
1 GB table that is a second gigabyte held for the duration of the load, the largest peak a
session has (docs/experiments-marian.md, "Weights in external data").

In a graph whose weights are in a data file, `split_projections` rewrites each such
projection as blocks of at most BLOCK_BYTES of W's rows, each an initializer that names W's
own bytes in the data file (same location, its offset and length; nothing is written
twice), transposed and multiplied on its own, the blocks' logits concatenated:

    MatMul(x, Transpose(W))
    -> Concat(MatMul(x, Transpose(W[0:r])), MatMul(x, Transpose(W[r:2r])), ...)

onnxruntime then folds and prepacks one block at a time, so the load's extra memory is one
block, and the steady state is what it was (one prepacked copy). Standard operators only
(a `--no-fuse` bundle stays standard ONNX); the logits are the same numbers (each column is
the same dot product).

`join_projections` undoes it, so that every transformation of a saved graph (quantization,
float16, the one-graph search) sees the exporter's form: `export/external_data.py` splits
when it saves a graph and joins when it loads one. The Concat carries MARKER and W's name in
its doc_string; the blocks' names are the original nodes' and tensors' plus BLOCK_SUFFIX.
Subgraphs (the one-graph search's decoder) are left as they are.
"""

from __future__ import annotations

import math

import onnx
from onnx.external_data_helper import uses_external_data

BLOCK_BYTES = 64 << 20  # rows of W per block: the largest transient copy a load makes
MARKER = "edgeseq tied projection of "
BLOCK_SUFFIX = "/rows"
PAGE = 4096  # block offsets stay page-aligned when W's is, so that each block can be mapped
ELEMENT_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2}


def _external(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def rows_per_block(rows: int, row_bytes: int) -> int:
    """Rows of a block of a table of `rows` rows of `row_bytes`: at most BLOCK_BYTES (one row
    at least), a whole number of pages when a block that small fits (so that each block of a
    page-aligned table can be mapped where it lies)."""
    step = PAGE // math.gcd(row_bytes, PAGE)
    fit = BLOCK_BYTES // row_bytes
    return min(rows, max(1, fit // step * step if fit >= step else fit))


def _block(table: onnx.TensorProto, index: int, first: int, last: int) -> onnx.TensorProto:
    """Initializer for rows [first, last) of the external `table`: a view of its bytes."""
    entries = _external(table)
    row_bytes = table.dims[1] * ELEMENT_BYTES[table.data_type]
    block = onnx.TensorProto(name=f"{table.name}{BLOCK_SUFFIX}{index}", data_type=table.data_type)
    block.dims.extend([last - first, table.dims[1]])
    block.data_location = onnx.TensorProto.EXTERNAL
    offset = int(entries.get("offset", "0")) + first * row_bytes
    for key, value in (
        ("location", entries["location"]),
        ("offset", str(offset)),
        ("length", str((last - first) * row_bytes)),
    ):
        entry = block.external_data.add()
        entry.key, entry.value = key, value
    return block


def _copy_meta(target: onnx.NodeProto, source: onnx.NodeProto) -> None:
    target.metadata_props.extend(source.metadata_props)


def split_projections(model: onnx.ModelProto) -> bool:
    """Rewrite, in place, each `MatMul(x, Transpose(W, perm=[1, 0]))` of the main graph whose
    W is an external float (vocab, D) initializer of more than BLOCK_BYTES into blocks of
    W's rows (module docstring); return whether anything changed."""
    graph = model.graph
    inits = {tensor.name: tensor for tensor in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    changed = False
    for transpose in list(graph.node):
        table = inits.get(transpose.input[0]) if transpose.op_type == "Transpose" else None
        if table is None or not uses_external_data(table) or len(table.dims) != 2:
            continue
        if table.data_type not in ELEMENT_BYTES or transpose.output[0] in outputs:
            continue
        perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
        users = readers.get(transpose.output[0], [])
        if perm != [1, 0] or len(users) != 1 or users[0].op_type != "MatMul":
            continue
        matmul = users[0]
        rows, width = table.dims
        row_bytes = width * ELEMENT_BYTES[table.data_type]
        if matmul.input[1] != transpose.output[0] or rows * row_bytes <= BLOCK_BYTES:
            continue
        per_block = rows_per_block(rows, row_bytes)
        nodes, pieces = [], []
        for index, first in enumerate(range(0, rows, per_block)):
            block = _block(table, index, first, min(rows, first + per_block))
            graph.initializer.append(block)
            turned = f"{transpose.output[0]}{BLOCK_SUFFIX}{index}"
            piece = f"{matmul.output[0]}{BLOCK_SUFFIX}{index}"
            node_t = onnx.helper.make_node(
                "Transpose", [block.name], [turned], f"{transpose.name}{BLOCK_SUFFIX}{index}",
                perm=[1, 0],
            )  # fmt: skip
            node_m = onnx.helper.make_node(
                "MatMul", [matmul.input[0], turned], [piece], f"{matmul.name}{BLOCK_SUFFIX}{index}"
            )
            _copy_meta(node_t, transpose)
            _copy_meta(node_m, matmul)
            nodes += [node_t, node_m]
            pieces.append(piece)
        concat = onnx.helper.make_node(
            "Concat", pieces, [matmul.output[0]], matmul.name, f"{MARKER}{table.name}", axis=-1
        )
        _copy_meta(concat, matmul)
        at = list(graph.node).index(matmul)  # x is computed before it, the blocks are weights
        for offset, node in enumerate([*nodes, concat]):
            graph.node.insert(at + offset, node)
        graph.node.remove(matmul)
        graph.node.remove(transpose)
        changed = True
    return changed


def join_projections(model: onnx.ModelProto) -> bool:
    """Undo `split_projections` in place (the exporter's `MatMul(x, Transpose(W))` again, the
    block initializers removed); return whether anything changed."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    changed = False
    for concat in list(graph.node):
        if concat.op_type != "Concat" or not concat.doc_string.startswith(MARKER):
            continue
        table = concat.doc_string[len(MARKER) :]
        matmuls = [producer[name] for name in concat.input]
        transposes = [producer[m.input[1]] for m in matmuls]
        blocks = {t.input[0] for t in transposes}
        first_t, first_m = transposes[0], matmuls[0]
        turned = first_t.output[0].rsplit(BLOCK_SUFFIX, 1)[0]
        transpose = onnx.helper.make_node(
            "Transpose", [table], [turned], first_t.name.rsplit(BLOCK_SUFFIX, 1)[0], perm=[1, 0]
        )
        _copy_meta(transpose, first_t)
        matmul = onnx.helper.make_node(
            "MatMul", [first_m.input[0], turned], [concat.output[0]], concat.name
        )
        _copy_meta(matmul, concat)
        for node in [*transposes, *matmuls]:
            graph.node.remove(node)
        at = list(graph.node).index(concat)
        graph.node.remove(concat)
        graph.node.insert(at, matmul)
        graph.node.insert(at, transpose)
        for tensor in [t for t in graph.initializer if t.name in blocks]:
            graph.initializer.remove(tensor)
        changed = True
    return changed
