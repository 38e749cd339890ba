"""Fused activations (:mod:`tuner.graph.optimize`): element-wise regions hb_mapper runs as one lookup table.

``x * sigmoid(x)`` (SiLU/Swish), ``x * hardsigmoid(x)`` (alpha 1/6, beta 1/2 only:
:data:`tuner.graph.hz.HB_HARD_SIGMOID`), ``x * clip(x + 3, 0, 6) / 6`` (HardSwish),
``x * tanh(softplus(x))`` (Mish) and the erf / tanh forms of GELU each become one node of an ONNX
model-local function (domain ``tuner.hz``) named after the region's last node; onnxruntime inlines
it, so the float values are unchanged. The evidence is in :mod:`tuner.graph.optimize`'s docstring.
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import helper

from tuner.graph.edit import consumers
from tuner.graph.hz import HZ_DOMAIN, is_hb_hard_sigmoid
from tuner.graph.names import NameMap, Rewrite

#: Element-wise ops a fused activation region may contain.
_REGION_OPS = frozenset({"Sigmoid", "HardSigmoid", "Tanh", "Softplus", "Erf", "Exp", "Log", "Clip", "Relu",
                         "Add", "Sub", "Mul", "Div", "Pow", "Sqrt"})


def _kind(ops: Counter) -> str | None:
    """Which fused activation a single-source element-wise region computes (by its op multiset)."""
    kinds = {
        "HzSwish": [Counter({"Sigmoid": 1, "Mul": 1})],
        "HzHardSwish": [Counter({"HardSigmoid": 1, "Mul": 1}), Counter({"Add": 1, "Clip": 1, "Mul": 1, "Div": 1}),
                        Counter({"Add": 1, "Clip": 1, "Mul": 2}), Counter({"Add": 1, "Relu": 1, "Clip": 1, "Mul": 1, "Div": 1})],
        "HzMish": [Counter({"Softplus": 1, "Tanh": 1, "Mul": 1}), Counter({"Exp": 1, "Add": 1, "Log": 1, "Tanh": 1, "Mul": 1})],
    }
    for kind, forms in kinds.items():
        if ops in forms:
            return kind
    if ops["Erf"] == 1 and ops["Mul"] >= 2 and set(ops) <= {"Erf", "Mul", "Div", "Add"}:
        return "HzGelu"
    if ops["Tanh"] == 1 and ops["Pow"] + ops["Mul"] >= 4 and set(ops) <= {"Tanh", "Mul", "Add", "Pow"}:
        return "HzGelu"
    return None


def _region(end: onnx.NodeProto, producer: dict[str, onnx.NodeProto], users: dict[str, list[onnx.NodeProto]],
            consts: set[str], outputs: set[str]) -> tuple[list[onnx.NodeProto], str, str] | None:
    """The largest single-source element-wise region ending at ``end`` that computes a known fused
    activation: (nodes, source tensor, kind)."""
    closure = {id(end): end}
    stack = [end]
    while stack:
        n = stack.pop()
        for t in n.input:
            p = producer.get(t)
            if p is None or t in consts or id(p) in closure or p.op_type not in _REGION_OPS or t in outputs:
                continue
            if p.domain not in ("", "ai.onnx") or len(p.output) != 1:
                continue
            closure[id(p)] = p
            stack.append(p)
    members = list(closure.values())
    # Candidate sources: activation tensors read by the closure. For each, keep the members that
    # depend on it; the region is valid when every member reads only the source, constants or
    # other members, and every member except ``end`` is read only inside the region.
    best: tuple[list[onnx.NodeProto], str, str] | None = None
    for src in {t for n in members for t in n.input if t and t not in consts}:
        region_ids: set[int] = set()
        changed = True
        produced = {src}
        while changed:
            changed = False
            for n in members:
                if id(n) not in region_ids and any(t in produced for t in n.input):
                    region_ids.add(id(n))
                    produced.update(n.output)
                    changed = True
        region = [n for n in members if id(n) in region_ids]
        if end not in region or len(region) < 2:
            continue
        ok = all(all((not t) or t in consts or t == src or (t in produced and t != src) for t in n.input) for n in region)
        ok = ok and all(n is end or all(u in region for u in users.get(n.output[0], [])) for n in region)
        ok = ok and src not in {n.output[0] for n in region}
        # x * f(x): some Mul multiplies two values computed from the source (sigmoid(x) * 80 is no SiLU)
        ok = ok and any(n.op_type == "Mul" and all(t and t not in consts for t in n.input) for n in region)
        kind = _kind(Counter(n.op_type for n in region)) if ok else None
        if kind == "HzHardSwish" and not all(is_hb_hard_sigmoid(n) for n in region if n.op_type == "HardSigmoid"):
            kind = None     # x * hardsigmoid(x) with another slope is no HardSwish for hb (HB_HARD_SIGMOID)
        if kind is not None and (best is None or len(region) > len(best[0])):
            best = (region, src, kind)
    return best


def fuse_activations(model: onnx.ModelProto, names: NameMap) -> None:
    graph = model.graph
    consts = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    producer = {o: n for n in graph.node for o in n.output}
    users = consumers(graph)
    order = {id(n): i for i, n in enumerate(graph.node)}
    taken: set[int] = set()
    replace: dict[int, onnx.NodeProto | None] = {}
    functions: dict[bytes, onnx.FunctionProto] = {}
    per_kind: Counter = Counter()
    default_opset = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    for end in reversed(list(graph.node)):   # later ends first: the largest regions win
        if id(end) in taken or end.op_type not in ("Mul", "Div") or end.domain not in ("", "ai.onnx"):
            continue
        found = _region(end, producer, users, consts, outputs)
        if found is None:
            continue
        region, src, kind = found
        if any(id(n) in taken for n in region):
            continue
        region.sort(key=lambda n: order[id(n)])
        fn_inputs = [src] + sorted({t for n in region for t in n.input if t in consts})
        local = {t: f"i{k}" for k, t in enumerate(fn_inputs)}
        local[end.output[0]] = "y"
        body = []
        for n in region:
            b = onnx.NodeProto()
            b.CopyFrom(n)
            b.name = ""
            for k, t in enumerate(b.input):
                if t:
                    b.input[k] = local.setdefault(t, f"t{len(local)}")
            for k, t in enumerate(b.output):
                b.output[k] = local.setdefault(t, f"t{len(local)}")
            body.append(b)
        key = kind.encode() + b"|" + b"".join(b.SerializeToString() for b in body)
        if key not in functions:
            fname = f"{kind}__{per_kind[kind]}"
            per_kind[kind] += 1
            functions[key] = helper.make_function(HZ_DOMAIN, fname, [f"i{k}" for k in range(len(fn_inputs))], ["y"],
                                                  body, default_opset)
        fn = functions[key]
        # named after the region's last node (SiLU: its Mul), HardSwish after its x * f(x) Mul even when a
        # Div by 6 follows (measured: x * clip(x + 3, 0, 6) / 6 is hb's ``HzHardSwish <the Mul>``)
        head = next((n for n in region if n.op_type == "Mul" and all(t and t not in consts for t in n.input)), end) \
            if kind == "HzHardSwish" else end
        fused = helper.make_node(fn.name, fn_inputs, [end.output[0]], name=head.name, domain=HZ_DOMAIN)
        for n in region:
            taken.add(id(n))
            replace[id(n)] = None
            names.rewrites[n.name] = Rewrite(n.name, n.op_type, (head.name,),
                                             tuple((k, head.name, 0) for k, t in enumerate(n.input) if t == src),
                                             head.name if n is end or n is head else None, f"fused into {kind}")
        replace[id(end)] = fused
    if not replace:
        return
    new_nodes = []
    for n in graph.node:
        if id(n) in replace:
            if replace[id(n)] is not None:
                new_nodes.append(replace[id(n)])
        else:
            new_nodes.append(n)
    del graph.node[:]
    graph.node.extend(new_nodes)
    model.functions.extend(functions.values())
    if not any(o.domain == HZ_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(HZ_DOMAIN, 1))
