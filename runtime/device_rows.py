"""Row gathers that run where the tensors live: a Gather graph on the session's provider.

    rows = DeviceRows.like(decoder_session)           # same provider, device and options
    kept = rows.gather([cache_k0, cache_v0], np.array([0, 0, 2]))   # OrtValues, same device

onnxruntime's Python `OrtValue` has no gather of its own: `value.numpy()[rows]` brings a
CUDA tensor to the host and back. `DeviceRows` runs a graph of one `Gather(axis=0)` per
tensor instead, on the provider the decoder runs on, with every input and output bound in
place (IO binding), so beam reordering and finished rows leaving move only the row indices
(a few bytes) across the bus. The same code runs on the CPU provider with CPU `OrtValue`s,
which is how the tests check it.

The graph is written here as ONNX protobuf bytes (`gather_model`): the runtime does not
depend on the `onnx` package. One graph per tuple of element types and ranks, made and
opened once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

ROWS = "rows"  # the graph's int64 (R,) input: the rows to take, may repeat
GATHER_OPSET = 13  # Gather's current version
GATHER_IR_VERSION = 8  # read by every onnxruntime the bundles support (>= 1.18)

# ONNX TensorProto element types of the OrtValue type strings the state holds.
ELEMENT_TYPES = {
    "tensor(float)": 1,
    "tensor(uint8)": 2,
    "tensor(int8)": 3,
    "tensor(int32)": 6,
    "tensor(int64)": 7,
    "tensor(bool)": 9,
    "tensor(float16)": 10,
}


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
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


def _tensor_value(name: str, element_type: int, dims: Sequence[str]) -> bytes:
    """ValueInfoProto: a tensor of `element_type` whose dimensions are the named `dims`."""
    shape = b"".join(_field(1, _field(2, dim)) for dim in dims)  # Dimension.dim_param
    tensor_type = _field(1, element_type) + _field(2, shape)  # elem_type, shape
    return _field(1, name) + _field(2, _field(1, tensor_type))  # name, type.tensor_type


def gather_model(signature: Sequence[tuple[int, int]]) -> bytes:
    """Serialized ONNX model: inputs `rows` int64 (R,) and x0..x{n-1}, one per (element type,
    rank) of `signature`, each (B, ...); outputs y0..y{n-1}, yi = Gather(xi, rows, axis=0)
    (R, ...)."""
    graph = b""
    for i in range(len(signature)):
        axis = _field(1, "axis") + _field(3, 0) + _field(20, 2)  # name, i, type INT
        node = (
            _field(1, f"x{i}")
            + _field(1, ROWS)
            + _field(2, f"y{i}")
            + _field(3, f"gather{i}")
            + _field(4, "Gather")
            + _field(5, axis)
        )
        graph += _field(1, node)
    graph += _field(2, "device_rows")
    graph += _field(11, _tensor_value(ROWS, ELEMENT_TYPES["tensor(int64)"], ["R"]))
    for i, (element_type, rank) in enumerate(signature):
        dims = [f"x{i}_{j}" for j in range(rank)]
        graph += _field(11, _tensor_value(f"x{i}", element_type, dims))
        graph += _field(12, _tensor_value(f"y{i}", element_type, ["R", *dims[1:]]))
    opset = _field(1, "") + _field(2, GATHER_OPSET)  # OperatorSetIdProto: domain, version
    return (
        _field(1, GATHER_IR_VERSION)
        + _field(2, "edgeseq")  # producer_name
        + _field(7, graph)
        + _field(8, opset)
    )


class DeviceRows:
    """Gathers rows of `OrtValue`s on one provider's device (see the module docstring)."""

    def __init__(
        self,
        providers: Sequence[str | tuple[str, dict]],
        options: ort.SessionOptions | None,
        device_type: str,
        device_id: int = 0,
    ) -> None:
        self.providers = list(providers)
        self.options = options
        self.device_type, self.device_id = device_type, device_id
        self._sessions: dict[tuple[tuple[int, int], ...], ort.InferenceSession] = {}

    @classmethod
    def like(
        cls, session: ort.InferenceSession, device_type: str, device_id: int = 0
    ) -> DeviceRows:
        """Gathers on `session`'s active providers (with their options) and session options,
        writing outputs to `device_type` memory ("cuda" or "cpu")."""
        names = session.get_providers()
        provider_options = session.get_provider_options()
        providers = [(name, dict(provider_options.get(name, {}))) for name in names]
        return cls(providers, session.get_session_options(), device_type, device_id)

    def _session(self, signature: tuple[tuple[int, int], ...]) -> ort.InferenceSession:
        """The gather graph for this (element type, rank) tuple, opened on first use."""
        session = self._sessions.get(signature)
        if session is None:
            session = ort.InferenceSession(
                gather_model(signature), self.options, providers=self.providers
            )
            self._sessions[signature] = session
        return session

    def gather(self, values: Sequence[ort.OrtValue], rows: np.ndarray) -> tuple[ort.OrtValue, ...]:
        """values[i] (B, ...) -> values[i][rows] (R, ...) for int64 `rows` (R,) (may repeat),
        each a new OrtValue on this object's device; one graph run for all of them."""
        if not values:
            return ()
        signature = tuple((ELEMENT_TYPES[v.data_type()], len(v.shape())) for v in values)
        session = self._session(signature)
        binding = session.io_binding()
        binding.bind_cpu_input(ROWS, np.ascontiguousarray(rows, dtype=np.int64))
        for i, value in enumerate(values):
            binding.bind_ortvalue_input(f"x{i}", value)
            binding.bind_output(f"y{i}", self.device_type, self.device_id)
        session.run_with_iobinding(binding)
        return tuple(binding.get_outputs())
