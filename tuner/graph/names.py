"""What hb_mapper's optimizer did to the user's nodes (tuner.graph.optimize), and node_info under either name.

:class:`NameMap` remembers every rewrite so that ``node_info`` may name a node either as the user's
ONNX does (``/blk/Div``, ``/act/Sigmoid``) or as hb_mapper reports it (``/blk/Div_mul``), and so that
an entry for a removed node (an Identity, a folded Constant) gets a note instead of "not in the model".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rewrite:
    """What became of one node of the user's ONNX.

    ``nodes``: the nodes that stand for it in the optimized graph (empty: removed). ``inputs`` maps
    its input index k to (node, input index) there, for ``InputType<k>``; ``output`` is the node
    whose output is its output, for ``OutputType``.
    """

    onnx_name: str
    op_type: str
    nodes: tuple[str, ...]
    inputs: tuple[tuple[int, str, int], ...]
    output: str | None
    reason: str


@dataclass
class NameMap:
    """ONNX node name -> its rewrite, for the nodes the optimizer changed (others keep their name)."""

    rewrites: dict[str, Rewrite] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rewrites)

    def removed(self, name: str) -> Rewrite | None:
        r = self.rewrites.get(name)
        return r if r is not None and not r.nodes else None

    def translate(self, nodes: tuple, known: set[str]) -> tuple[dict[str, dict[str, str]], list[str]]:
        """``node_info`` entries (name -> fields) addressed to the optimized graph's nodes, and notes.

        An entry under a name the optimized graph has is kept as it is and wins over entries that
        reach the same node through a rewrite. An ONNX name the optimizer replaced lends its
        fields to the nodes standing for it: ``ON`` to all of them, ``InputType<k>`` / ``InputType``
        to the nodes reading its inputs, ``OutputType`` to the node writing its output. An entry
        for a removed node is dropped with a note. Unknown names are returned unchanged (the
        caller reports them).
        """
        direct: dict[str, dict[str, str]] = {}
        lent: dict[str, dict[str, str]] = defaultdict(dict)
        notes: list[str] = []
        for name, fields in nodes:
            r = self.rewrites.get(name)
            if r is None or (name in known and r.nodes != (name,)):
                direct[name] = dict(fields)
                continue
            if not r.nodes:
                notes.append(f"node_info {name!r} ({r.op_type}): {r.reason} by hb_mapper's optimizer before "
                             "calibration; the entry has no effect")
                continue
            own = r.nodes == (name,)
            applied = False
            for key, value in fields.items():
                if key == "ON" and not own and r.reason.startswith("fused into"):
                    # hb places a fused activation by its own name only: ON: CPU on the Sigmoid, HardSigmoid,
                    # Tanh, Erf, Add, Clip or Div of one leaves it on the BPU (toys, docs/hb_rules/placement.md 8)
                    notes.append(f"node_info {name!r} ({r.op_type}): {r.reason}; its 'ON' has no effect (hb_mapper "
                                 f"places the fused node by its own name, {', '.join(r.nodes)})")
                    continue
                if key == "ON":
                    targets = [(n, key) for n in r.nodes]
                elif key == "OutputType":
                    targets = [(r.output, key)] if r.output else []
                elif key == "InputType":
                    targets = [(n, key) for n in dict.fromkeys(m for _, m, _ in r.inputs)] or \
                        ([(name, key)] if own else [])
                elif key.startswith("InputType"):
                    targets = [(n, f"InputType{j}") for ki, n, j in r.inputs if str(ki) == key[len("InputType"):]]
                else:
                    targets = [(n, key) for n in r.nodes]
                for node, field_name in targets:
                    applied = True
                    if own:
                        direct.setdefault(node, {})[field_name] = value
                    else:
                        lent[node].setdefault(field_name, value)
            if not own and applied:
                notes.append(f"node_info {name!r} ({r.op_type}): {r.reason}; applied to {', '.join(r.nodes)}")
        for node, fields in lent.items():
            merged = dict(fields)
            merged.update(direct.get(node, {}))
            direct[node] = merged
        return direct, notes

    def summary(self) -> list[str]:
        """One line per kind of rewrite, for ``tuner eval``'s notes."""
        counts = Counter(r.reason.split(":")[0] for r in self.rewrites.values())
        return [f"hb_mapper's optimizer: {reason} ({n} ONNX node{'s' if n != 1 else ''})"
                for reason, n in sorted(counts.items())]
