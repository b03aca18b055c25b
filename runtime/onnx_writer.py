"""Small ONNX graphs written as protobuf bytes, without the `onnx` package (the runtime does not
depend on it): tensors of named dynamic dimensions, nodes with int and ints attributes, int64
initializers. Field numbers are onnx.proto's (runtime/onnx_proto.py reads the same format).

    node = make_node("Gather", ["x", "rows"], ["y"], axis=0)
    graph = make_graph("g", [node], inputs=[tensor_value("x", FLOAT, ["B", "D"]), ...],
                       outputs=[...], initializers=[int64_tensor("axes", [2])])
    onnxruntime.InferenceSession(make_model(graph, opset=13))
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IR_VERSION = 8  # read by every onnxruntime the bundles support (>= 1.18)
# TensorProto element types
FLOAT, UINT8, INT8, INT32, INT64, BOOL, FLOAT16 = 1, 2, 3, 6, 7, 9, 10
ATTRIBUTE_INT, ATTRIBUTE_INTS = 2, 7  # AttributeProto.type


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int (a negative one as its 64-bit two's
    complement, as protobuf writes int64)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | str | int) -> bytes:
    """One protobuf field: an int as a varint, bytes or str as a length-delimited record."""
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def tensor_value(name: str, element_type: int, dims: Sequence[str]) -> bytes:
    """ValueInfoProto: a tensor of `element_type` whose dimensions are the named `dims`."""
    shape = b"".join(_field(1, _field(2, dim)) for dim in dims)  # Dimension.dim_param
    tensor_type = _field(1, element_type) + _field(2, shape)  # elem_type, shape
    return _field(1, name) + _field(2, _field(1, tensor_type))  # name, type.tensor_type


def int64_tensor(name: str, values: Sequence[int]) -> bytes:
    """TensorProto: a 1-D int64 constant (dims, data_type, raw_data, name)."""
    raw = np.asarray(values, dtype="<i8").tobytes()
    return _field(1, len(values)) + _field(2, INT64) + _field(9, raw) + _field(8, name)


def make_node(
    op_type: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: object
) -> bytes:
    """NodeProto of the default domain; `attrs` ints or lists of ints."""
    node = b"".join(_field(1, name) for name in inputs)
    node += b"".join(_field(2, name) for name in outputs)
    node += _field(3, f"{op_type}_{outputs[0]}") + _field(4, op_type)
    for key, value in attrs.items():
        if isinstance(value, int):
            attribute = _field(1, key) + _field(3, value) + _field(20, ATTRIBUTE_INT)
        else:
            ints = b"".join(_field(8, int(v)) for v in value)  # type: ignore[attr-defined]
            attribute = _field(1, key) + ints + _field(20, ATTRIBUTE_INTS)
        node += _field(5, attribute)
    return node


def make_graph(
    name: str,
    nodes: Sequence[bytes],
    inputs: Sequence[bytes],
    outputs: Sequence[bytes],
    initializers: Sequence[bytes] = (),
) -> bytes:
    """GraphProto of `nodes`, value infos `inputs` and `outputs`, and `initializers`."""
    graph = b"".join(_field(1, node) for node in nodes) + _field(2, name)
    graph += b"".join(_field(5, tensor) for tensor in initializers)
    graph += b"".join(_field(11, value) for value in inputs)
    return graph + b"".join(_field(12, value) for value in outputs)


def make_model(graph: bytes, opset: int) -> bytes:
    """Serialized ModelProto of `graph` with the default domain at `opset`."""
    opset_id = _field(1, "") + _field(2, opset)  # OperatorSetIdProto: domain, version
    return _field(1, IR_VERSION) + _field(2, "edgeseq") + _field(7, graph) + _field(8, opset_id)
