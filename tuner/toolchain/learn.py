"""What a real log teaches the next study: a target table corrected by the tool's decisions.

``tuner import-log LOG --config YAML --update-target FILE`` writes (or updates) a target
table, a copy of the march's ``search_spaces/targets/<march>.yaml`` with:

* int16 taken away from an op type when the tool refused every int16 request on nodes of
  that type in the logs seen so far (and honoured none): the next study does not offer
  int16 choices the tool drops, and the simulator stops modelling them;
* an op type moved from ``bpu_ops`` to ``bpu_default_cpu`` when the tool put every node of
  that type on the CPU although nothing asked for it (shape limits, unsupported
  attributes): the study no longer counts on it running on the BPU unless forced.

Per-op-type is coarse (the tool decides per node and per context), so the rules only fire
when the evidence is unanimous, and the ``learned`` section lists every node and log behind
each change, to be checked by hand. Thresholds are not fed back: they are compared only.
A space uses the file with ``march: path/to/learned.yaml`` (relative to the space file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tuner.errors import TunerError
from tuner.files import write_atomic
from tuner.graph import Target, load_target
from tuner.toolchain.compare import Comparison


def _evidence(base: dict[str, Any]) -> dict[str, Any]:
    learned = base.get("learned") or {}
    return {"logs": list(learned.get("logs") or []),
            "int16": {k: dict(v) for k, v in (learned.get("int16") or {}).items()},
            "placement": {k: dict(v) for k, v in (learned.get("placement") or {}).items()}}


def learned_target(comparison: Comparison, target: Target, out: Path) -> tuple[dict[str, Any], list[str]]:
    """The updated table and a list of the changes made (``out`` is read if it exists)."""
    if out.is_file():
        try:
            raw = yaml.safe_load(out.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise TunerError(f"{out}: invalid YAML ({exc}); choose another --update-target file") from None
        if not isinstance(raw, dict) or "march" not in raw:
            raise TunerError(f"{out}: not a tuner target table (no 'march' key); choose another --update-target file")
        if raw["march"] != target.march:
            raise TunerError(f"{out}: a table for march {raw['march']!r}, the YAML is for {target.march!r}")
    else:
        raw = dict(target.raw)
    ev = _evidence(raw)
    source = comparison.source or "?"
    if source not in ev["logs"]:
        ev["logs"].append(source)
    for n in comparison.nodes:
        if n.int16_requested and n.int16_refused is not None:
            e = ev["int16"].setdefault(n.op_type, {"refused": [], "kept": []})
            bucket = e["refused"] if n.int16_refused else e["kept"]
            if n.node not in bucket:
                bucket.append(n.node)
        if n.real_on is not None:
            e = ev["placement"].setdefault(n.op_type, {"cpu_unasked": [], "bpu": []})
            if n.real_on == "CPU" and n.sim_on == "BPU":
                if n.node not in e["cpu_unasked"]:
                    e["cpu_unasked"].append(n.node)
            elif n.real_on == "BPU" and n.node not in e["bpu"]:
                e["bpu"].append(n.node)
    changes = []
    for op, e in sorted(ev["int16"].items()):
        if e["refused"] and not e["kept"]:
            for key in ("int16_ops", "int16_input_only"):
                if op in (raw.get(key) or []):
                    raw[key] = [x for x in raw[key] if x != op]
                    changes.append(f"{op}: no int16 (refused on {', '.join(e['refused'][:3])}"
                                   f"{' ...' if len(e['refused']) > 3 else ''})")
    for op, e in sorted(ev["placement"].items()):
        if e["cpu_unasked"] and not e["bpu"] and op in (raw.get("bpu_ops") or []):
            raw["bpu_ops"] = [x for x in raw["bpu_ops"] if x != op]
            raw["bpu_default_cpu"] = sorted(set(raw.get("bpu_default_cpu") or []) | {op})
            changes.append(f"{op}: on the CPU unless forced (the tool placed {', '.join(e['cpu_unasked'][:3])} there)")
    raw["learned"] = ev
    return raw, changes


def write_learned_target(comparison: Comparison, target: Target, out: Path) -> list[str]:
    raw, changes = learned_target(comparison, target, out)
    head = (f"# tuner target table for march {raw['march']}, corrected by real hb_mapper logs (tuner import-log "
            "--update-target).\n# Use it with 'march: <this file>' in a space file. 'learned' lists the evidence.\n")
    write_atomic(out, head + yaml.safe_dump(raw, sort_keys=False, width=110))
    load_target(out)   # it must load as a target
    return changes
