"""The float ONNX model: loaded, checked, and prepared for simulation.

Preparation makes the graph easy to rewrite: Constant nodes become initializers, input
shapes are fixed (from the YAML's ``input_shape`` when the model's are dynamic), every node
has a name, and shape inference gives every tensor a dtype and rank.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from tuner.errors import TunerError
from tuner.graph.names import NameMap, Rewrite
from tuner.graph.optimize import optimize

FLOAT = onnx.TensorProto.FLOAT


@dataclass
class LoadedModel:
    """A prepared float model plus what we learned while preparing it."""

    path: Path
    proto: onnx.ModelProto
    fingerprint: str
    input_shapes: dict[str, tuple[int, ...]]
    opset: int
    ir_version: int
    warnings: list[str] = field(default_factory=list)
    #: what hb_mapper's optimizer changed (tuner.graph.optimize); ``proto`` is the optimized graph
    names: NameMap = field(default_factory=NameMap)

    @property
    def input_names(self) -> list[str]:
        return list(self.input_shapes)

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.proto.graph.output]


def file_fingerprint(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    dims = vi.type.tensor_type.shape.dim
    if not vi.type.tensor_type.HasField("shape"):
        return None
    shape = []
    for d in dims:
        if not d.HasField("dim_value") or d.dim_value <= 0:
            return None
        shape.append(d.dim_value)
    return tuple(shape)


def _check_static_dims(path: Path, vi: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    """A static dimension of the model's input must equal input_shape's (hb_mapper refuses otherwise);
    a dynamic one (a symbol, or no value) may take any value."""
    model_dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                  for d in vi.type.tensor_type.shape.dim]
    bad = [i for i, (m, s) in enumerate(zip(model_dims, shape)) if m is not None and m != s]
    if bad:
        model_txt = "x".join("?" if m is None else str(m) for m in model_dims)
        raise TunerError(f"{path}: input_shape {'x'.join(map(str, shape))} does not match input {vi.name!r}'s "
                         f"static shape {model_txt} (dimension {', '.join(map(str, bad))}); hb_mapper refuses "
                         f"this: set input_parameters.input_shape to {model_txt.replace('?', 'N')} "
                         "(only dynamic dimensions may change) or re-export the model with that input size")


def load_model(path: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None,
               max_opset: int | None = None, max_ir: int | None = None, hb_optimize: bool = True) -> LoadedModel:
    """Load ``path`` and prepare it. ``input_shapes`` overrides the model's (YAML input_shape).

    With ``hb_optimize`` (the default) the model is then rewritten as hb_mapper's optimizer
    rewrites it before calibration (:mod:`tuner.graph.optimize`); without, it is the exported
    graph as it is (onnxruntime's own quantizer sees that one: the oracle tests use it).
    """
    path = Path(path)
    proto = _read_proto(path)
    ir_version = proto.ir_version
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    warnings = _version_warnings(opset, ir_version, max_opset, max_ir)
    shapes = _fix_input_shapes(path, proto, input_shapes)
    folded = _fold_constants(proto)
    _name_nodes(proto, warnings)
    # Shapes of intermediate tensors are stale once input shapes changed; recompute them.
    del proto.graph.value_info[:]
    for out in proto.graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        proto = shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise TunerError(f"{path}: ONNX shape inference failed ({exc}); check input_shape") from None
    names = NameMap()
    if hb_optimize:
        proto, names = optimize(proto)
        for name in folded:   # node_info naming one gets a note, not "not in the model"
            names.rewrites.setdefault(name, Rewrite(name, "Constant", (), (), None, "constant folded"))
        if names:
            del proto.graph.value_info[:]
            proto = shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    return LoadedModel(path=path, proto=proto, fingerprint=file_fingerprint(path), input_shapes=shapes,
                       opset=opset, ir_version=ir_version, warnings=warnings, names=names)


def _read_proto(path: Path) -> onnx.ModelProto:
    """The ONNX model at ``path``; a missing file, a Git LFS pointer, a damaged file or another format
    is a TunerError that says which."""
    if not path.is_file():
        raise TunerError(f"{path}: model file not found; check model_parameters.onnx_model "
                         "(relative paths are resolved against the YAML's folder)")
    with open(path, "rb") as f:
        head = f.read(64)
    if head.startswith(b"version https://git-lfs"):
        raise TunerError(f"{path}: a Git LFS pointer ({path.stat().st_size} bytes), not the model; fetch the file "
                         "itself with 'git lfs pull' (or download the model again)")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, google.protobuf errors, ...
        if head[:1] == b"\x08":  # ModelProto starts with its ir_version field: the file is cut or damaged
            raise TunerError(f"{path}: a truncated or damaged ONNX file ({path.stat().st_size} bytes; "
                             f"{type(exc).__name__}); copy or download the model again") from None
        raise TunerError(f"{path}: not an ONNX model ({type(exc).__name__}); export the float model to ONNX first") from None
    if len(proto.graph.node) == 0:
        raise TunerError(f"{path}: not an ONNX model (no graph nodes); export the float model to ONNX first")
    return proto


def _version_warnings(opset: int, ir_version: int, max_opset: int | None, max_ir: int | None) -> list[str]:
    """hb_mapper's limits on the opset and IR version (the march's), as warnings."""
    warnings: list[str] = []
    if max_opset is not None and opset > max_opset:
        warnings.append(f"the model uses opset {opset}; hb_mapper for this march takes opset <= {max_opset} "
                        "and will reject it: export with opset_version=11")
    if max_ir is not None and ir_version > max_ir:
        warnings.append(f"the model has ir_version {ir_version}; hb_mapper takes ir_version <= {max_ir}")
    return warnings


def _fix_input_shapes(path: Path, proto: onnx.ModelProto,
                      input_shapes: dict[str, tuple[int, ...]] | None) -> dict[str, tuple[int, ...]]:
    """Give every real input (float32) a static shape, the YAML's (``input_shapes``) or the model's, in
    place: input name -> shape. Initializers listed as inputs (old exporters) are dropped from the inputs."""
    graph = proto.graph
    init_names = {i.name for i in graph.initializer}
    real_inputs = [i for i in graph.input if i.name not in init_names]
    # Old exporters list initializers as graph inputs too; keep only the real inputs.
    if len(real_inputs) != len(graph.input):
        del graph.input[:]
        graph.input.extend(real_inputs)
    shapes: dict[str, tuple[int, ...]] = {}
    overrides = dict(input_shapes or {})
    if "" in overrides and len(real_inputs) == 1:  # input_name: '' names the only input
        overrides[real_inputs[0].name] = overrides.pop("")
    for vi in real_inputs:
        if vi.type.tensor_type.elem_type != FLOAT:
            raise TunerError(f"{path}: input {vi.name!r} is not float32; tuner simulates float32-input models")
        shape = overrides.pop(vi.name, None) or _static_shape(vi)
        if shape is None:
            raise TunerError(f"{path}: input {vi.name!r} has a dynamic shape; set input_parameters.input_shape "
                             "(e.g. '1x3x640x640') in the YAML")
        model_rank = len(vi.type.tensor_type.shape.dim)
        if model_rank and len(shape) != model_rank:
            raise TunerError(f"{path}: input_shape {'x'.join(map(str, shape))} has rank {len(shape)} but input "
                             f"{vi.name!r} has rank {model_rank}")
        if model_rank:
            _check_static_dims(path, vi, tuple(shape))
        shapes[vi.name] = tuple(shape)
        tt = vi.type.tensor_type
        tt.ClearField("shape")
        for d in shape:
            tt.shape.dim.add().dim_value = d
    if overrides:
        raise TunerError(f"{path}: input_parameters.input_name names {sorted(overrides)}, which the model does not "
                         f"have; its inputs are {[v.name for v in real_inputs]}")
    return shapes


def _fold_constants(proto: onnx.ModelProto) -> list[str]:
    """Turn Constant nodes into initializers: hb_mapper folds them too, and weights become visible.
    Returns the names of the (named) Constant nodes folded."""
    graph = proto.graph
    keep = []
    folded = []
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            attr = node.attribute[0]
            if attr.name == "value":
                tensor = onnx.TensorProto()
                tensor.CopyFrom(attr.t)
            else:
                value = onnx.helper.get_attribute_value(attr)
                tensor = numpy_helper.from_array(np.array(value, dtype=np.float32 if "float" in attr.name else np.int64))
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
            if node.name:
                folded.append(node.name)
        else:
            keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    return folded


def _name_nodes(proto: onnx.ModelProto, warnings: list[str]) -> None:
    """Give unnamed nodes deterministic names ``<OpType>_<k>`` (k counts per op type in graph order)."""
    used = {n.name for n in proto.graph.node if n.name}
    counters: dict[str, int] = {}
    unnamed = 0
    seen: set[str] = set()
    for node in proto.graph.node:
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        if node.name:  # duplicate name: node_info could not address both
            warnings.append(f"two nodes are named {node.name!r}; the second is renamed")
        unnamed += 1
        k = counters.get(node.op_type, 0)
        while f"{node.op_type}_{k}" in used:
            k += 1
        node.name = f"{node.op_type}_{k}"
        used.add(node.name)
        seen.add(node.name)
        counters[node.op_type] = k + 1
    if unnamed:
        warnings.append(f"{unnamed} nodes have no name; tuner names them <OpType>_<k> in graph order, which may differ "
                        "from hb_mapper's names: name the nodes in the ONNX before using node_info on them")
