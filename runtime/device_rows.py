"""Row and column edits of state tensors where they live: small graphs on the session's
provider.

    rows = DeviceRows.like(decoder_session, "cuda")    # same provider, device and options
    kept = rows.gather([cache_k0, cache_v0], np.array([0, 0, 2]))   # OrtValues, same device
    wide = rows.pad(cross, extra_rows=2, width=17)     # zero rows at the end, columns to 17
    rows.write(cross, slots=[1, 4], new=joined)        # rows 1 and 4 replaced
    rows.take(cache, rows=[0, 2], first=3)             # rows 0 and 2, columns 3..end
    rows.resolve(cache, held)       # row i, column t from row held[i, t] (in-place decoder)

onnxruntime's Python `OrtValue` has no gather or slice of its own: `value.numpy()[rows]`
brings a CUDA tensor to the host and back. `DeviceRows` runs a graph of one operation per
tensor instead (`Gather` on axis 0; `Pad`; `Concat` then `Gather`; `Gather` then `Slice`
on the column axis, axis 2 of a (B, H, T, dh) cache; for `resolve`, the in-place decoder's
cache read through its indirection, `Slice`, `Transpose`, `Reshape`, `Gather` of
(position, row) pairs, `Transpose` back and `Pad`), on the provider the decoder runs on,
with every input and output bound in place (IO binding): beam reordering, finished rows
leaving and the server's live batch changing move only row indices and a few sizes across
the bus. The same code runs on the CPU provider with CPU `OrtValue`s, which is how the tests
check it. Graphs are written as protobuf bytes (runtime/onnx_writer.py); one per operation
and tuple of element types and ranks, made and opened once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from . import onnx_writer as W

ROWS = "rows"  # int64 (R,): the rows to take, may repeat
OPSET = 13  # Gather, Pad (pads as an input), Concat, Slice, Transpose, Reshape
COLUMNS = 2  # the column axis of the tensors `pad` and `take` edit: T of (B, H, T, dh)

# ONNX TensorProto element types of the OrtValue type strings the state holds.
ELEMENT_TYPES = {
    "tensor(float)": W.FLOAT,
    "tensor(uint8)": W.UINT8,
    "tensor(int8)": W.INT8,
    "tensor(int32)": W.INT32,
    "tensor(int64)": W.INT64,
    "tensor(bool)": W.BOOL,
    "tensor(float16)": W.FLOAT16,
}
Signature = tuple[tuple[int, int], ...]  # (element type, rank) per tensor


def _tensors(signature: Signature, prefix: str) -> list[bytes]:
    """Value infos prefix0, prefix1, ...: one per (element type, rank) of `signature`, of
    named dynamic dimensions."""
    return [
        W.tensor_value(f"{prefix}{i}", element_type, [f"{prefix}{i}_{j}" for j in range(rank)])
        for i, (element_type, rank) in enumerate(signature)
    ]


def _model(
    name: str,
    nodes: list[bytes],
    inputs: list[bytes],
    signature: Signature,
    initializers: Sequence[bytes] = (),
) -> bytes:
    """A model of `nodes` reading `inputs` then x0, x1, ... and writing y0, y1, ..."""
    inputs = [*inputs, *_tensors(signature, "x")]
    graph = W.make_graph(name, nodes, inputs, _tensors(signature, "y"), initializers)
    return W.make_model(graph, OPSET)


def gather_model(signature: Signature) -> bytes:
    """Inputs `rows` int64 (R,) and x0..x{n-1}, one per (element type, rank) of `signature`,
    each (B, ...); outputs yi = Gather(xi, rows, axis=0) (R, ...)."""
    nodes = [
        W.make_node("Gather", [f"x{i}", ROWS], [f"y{i}"], axis=0) for i in range(len(signature))
    ]
    return _model("gather", nodes, [W.tensor_value(ROWS, W.INT64, ["R"])], signature)


def take_model(signature: Signature) -> bytes:
    """`gather_model` followed by a Slice of the column axis: inputs `rows`, `first` and
    `last` int64 (1,) and xi (B, H, T, dh); outputs xi[rows][:, :, first:last]."""
    nodes = []
    for i in range(len(signature)):
        nodes.append(W.make_node("Gather", [f"x{i}", ROWS], [f"g{i}"], axis=0))
        nodes.append(W.make_node("Slice", [f"g{i}", "first", "last", "axes"], [f"y{i}"]))
    inputs = [W.tensor_value(ROWS, W.INT64, ["R"])]
    inputs += [W.tensor_value(name, W.INT64, ["1"]) for name in ("first", "last")]
    return _model("take", nodes, inputs, signature, [W.int64_tensor("axes", [COLUMNS])])


def pad_model(signature: Signature) -> bytes:
    """Inputs `pads` int64 (2 x rank,) and xi; outputs xi zero-padded by `pads` (ONNX Pad's
    begins-then-ends layout)."""
    nodes = [W.make_node("Pad", [f"x{i}", "pads"], [f"y{i}"]) for i in range(len(signature))]
    pads = W.tensor_value("pads", W.INT64, [str(2 * signature[0][1])])
    return _model("pad", nodes, [pads], signature)


def write_model(signature: Signature) -> bytes:
    """Inputs `rows` int64 (R,), ni (N, ...) and xi (B, ...); outputs
    Gather(Concat(xi, ni), rows): row r of the result is xi[rows[r]] when rows[r] < B, else
    ni[rows[r] - B]."""
    nodes = []
    for i in range(len(signature)):
        nodes.append(W.make_node("Concat", [f"x{i}", f"n{i}"], [f"c{i}"], axis=0))
        nodes.append(W.make_node("Gather", [f"c{i}", ROWS], [f"y{i}"], axis=0))
    inputs = [W.tensor_value(ROWS, W.INT64, ["R"]), *_tensors(signature, "n")]
    return _model("write", nodes, inputs, signature)


def resolve_model(signature: Signature) -> bytes:
    """Inputs `index` int64 (P, R), `last` int64 (1,) = P, `shape` int64 (3,) = (P B, H, dh),
    `pads` int64 (8,) and xi (B, H, M, dh); outputs yi (R, H, M, dh) with
    yi[r, :, t] = xi[index[t, r] % B, :, t] for t < P (index[t, r] = t B + the row), zeros
    after: the first P columns, Transpose to (P, B, H, dh), Reshape to (P B, H, dh), Gather
    (P, R, H, dh), Transpose to (R, H, P, dh), Pad the columns to M."""
    nodes = []
    for i in range(len(signature)):
        nodes += [
            W.make_node("Slice", [f"x{i}", "zero", "last", "axes"], [f"s{i}"]),
            W.make_node("Transpose", [f"s{i}"], [f"t{i}"], perm=[2, 0, 1, 3]),
            W.make_node("Reshape", [f"t{i}", "shape"], [f"f{i}"]),
            W.make_node("Gather", [f"f{i}", "index"], [f"g{i}"], axis=0),
            W.make_node("Transpose", [f"g{i}"], [f"r{i}"], perm=[1, 2, 0, 3]),
            W.make_node("Pad", [f"r{i}", "pads"], [f"y{i}"]),
        ]
    inputs = [
        W.tensor_value("index", W.INT64, ["P", "R"]),
        W.tensor_value("last", W.INT64, ["1"]),
        W.tensor_value("shape", W.INT64, ["3"]),
        W.tensor_value("pads", W.INT64, ["8"]),
    ]
    constants = [W.int64_tensor("zero", [0]), W.int64_tensor("axes", [COLUMNS])]
    return _model("resolve", nodes, inputs, signature, constants)


def bind_input(binding: ort.IOBinding, name: str, value: np.ndarray | ort.OrtValue) -> None:
    """Bind input `name` to a host array (copied to the session's device as it runs) or to an
    OrtValue where it lives."""
    if isinstance(value, np.ndarray):
        binding.bind_cpu_input(name, np.ascontiguousarray(value))
    else:
        binding.bind_ortvalue_input(name, value)


MODELS = {
    "gather": gather_model,
    "take": take_model,
    "pad": pad_model,
    "write": write_model,
    "resolve": resolve_model,
}


class DeviceRows:
    """Edits rows and columns of `OrtValue`s on one provider's device (module docstring)."""

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
        self._sessions: dict[tuple[str, Signature], ort.InferenceSession] = {}

    @classmethod
    def like(
        cls, session: ort.InferenceSession, device_type: str, device_id: int = 0
    ) -> DeviceRows:
        """Edits on `session`'s active providers (with their options) and session options,
        writing outputs to `device_type` memory ("cuda" or "cpu")."""
        names = session.get_providers()
        provider_options = session.get_provider_options()
        providers = [(name, dict(provider_options.get(name, {}))) for name in names]
        return cls(providers, session.get_session_options(), device_type, device_id)

    def _run(
        self,
        op: str,
        values: Sequence[ort.OrtValue],
        host: dict[str, np.ndarray],
        others: Sequence[ort.OrtValue] = (),
    ) -> tuple[ort.OrtValue, ...]:
        """Run `op`'s graph for `values` (xi; `others` as ni), host inputs `host`."""
        signature = tuple((ELEMENT_TYPES[v.data_type()], len(v.shape())) for v in values)
        key = (op, signature)
        session = self._sessions.get(key)
        if session is None:  # opened on first use
            model = MODELS[op](signature)
            session = ort.InferenceSession(model, self.options, providers=self.providers)
            self._sessions[key] = session
        binding = session.io_binding()
        for name, array in host.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array, dtype=np.int64))
        for i, value in enumerate(values):
            binding.bind_ortvalue_input(f"x{i}", value)
            binding.bind_output(f"y{i}", self.device_type, self.device_id)
        for i, value in enumerate(others):
            binding.bind_ortvalue_input(f"n{i}", value)
        session.run_with_iobinding(binding)
        return tuple(binding.get_outputs())

    def gather(self, values: Sequence[ort.OrtValue], rows: np.ndarray) -> tuple[ort.OrtValue, ...]:
        """values[i] (B, ...) -> values[i][rows] (R, ...) for int64 `rows` (R,) (may repeat),
        each a new OrtValue on this object's device; one graph run for all of them."""
        return self._run("gather", values, {ROWS: rows}) if values else ()

    def take(
        self,
        values: Sequence[ort.OrtValue],
        rows: Sequence[int] | np.ndarray,
        first: int = 0,
        last: int | None = None,
    ) -> tuple[ort.OrtValue, ...]:
        """values[i] (B, H, T, dh) -> values[i][rows][:, :, first:last] (end: T)."""
        if not values:
            return ()
        end = values[0].shape()[COLUMNS] if last is None else last
        host = {ROWS: np.asarray(rows), "first": np.array([first]), "last": np.array([end])}
        return self._run("take", values, host)

    def pad(
        self, values: Sequence[ort.OrtValue], extra_rows: int = 0, width: int | None = None
    ) -> tuple[ort.OrtValue, ...]:
        """values[i] (B, H, T, dh) with `extra_rows` zero rows after the last and zero columns
        after the last up to `width` (default: T) -> (B + extra_rows, H, width, dh)."""
        if not values:
            return ()
        shape = values[0].shape()
        pads = np.zeros(2 * len(shape), dtype=np.int64)
        pads[len(shape)] = extra_rows  # end of axis 0
        pads[len(shape) + COLUMNS] = (shape[COLUMNS] if width is None else width) - shape[COLUMNS]
        return self._run("pad", values, {"pads": pads})

    def write(
        self,
        values: Sequence[ort.OrtValue],
        slots: Sequence[int] | np.ndarray,
        new: Sequence[ort.OrtValue],
    ) -> tuple[ort.OrtValue, ...]:
        """values[i] (B, ...) with rows `slots` (N,) replaced by new[i] (N, ...) in order."""
        if not values:
            return ()
        batch = values[0].shape()[0]
        rows = np.arange(batch)
        rows[np.asarray(slots, dtype=np.int64)] = batch + np.arange(len(slots))
        return self._run("write", values, {ROWS: rows}, new)

    def resolve(self, values: Sequence[ort.OrtValue], held: np.ndarray) -> tuple[ort.OrtValue, ...]:
        """values[i] (B, H, M, dh) -> (R, H, M, dh) whose row r holds, at each column t < P,
        values[i][held[r, t], :, t], for int `held` (R, P) (rows may repeat); columns P.. are
        zero. The in-place decoder's cache read through its indirection into rows of their
        own (runtime/kinds/in_place_device.py)."""
        if not values:
            return ()
        batch, heads, length, d_head = values[0].shape()
        past = held.shape[1]
        index = np.arange(past)[:, None] * batch + np.asarray(held, dtype=np.int64).T
        pads = np.zeros(8, dtype=np.int64)
        pads[4 + COLUMNS] = length - past  # end of the column axis
        host = {
            "index": index,
            "last": np.array([past]),
            "shape": np.array([past * batch, heads, d_head]),
            "pads": pads,
        }
        return self._run("resolve", values, host)
