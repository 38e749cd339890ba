"""``tuner nodes``: the node names to copy into node_info, with op type, default placement and int16 keys."""

from __future__ import annotations

import argparse
import json

from tuner.commands import args as a


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nodes", help="list the model's node names as node_info takes them (op type, default "
                                     "placement, int16 keys the march allows)",
                       description="List every node of the YAML's model as hb_mapper names it (after its graph "
                                   "rewrites): what to copy into model_parameters.node_info. Reads the model only.")
    a.config(p)
    p.add_argument("--op", help="only nodes of this op type (e.g. Conv)")
    a.march(p)
    a.json_output(p, "print the nodes as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.console import table
    from tuner.inputs.nodes import list_nodes

    rows = list_nodes(args.config, args.op, args.march)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    print(table(["node", "type", "default ON", "ON may be", "int16 (node_info keys)", "node_info now"],
                [[r.name, r.op_type, r.default, "/".join(r.placements), ", ".join(r.int16) or "-",
                  ", ".join(f"{k}: {v}" for k, v in r.node_info.items()) if r.node_info else ""] for r in rows]))
    print(f"\n{len(rows)} node(s)" + (f" of type {args.op}" if args.op else ""))
    return 0
