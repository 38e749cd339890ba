"""Read hb_mapper makertbin's conversion log (reference section 9.1) into typed records.

What the log holds and tuner uses: the per-node table (``Node ON Subgraph Type Cosine
Similarity Threshold DataType``; older builds print ``In/Out DataType`` such as
``int8/int32``), the model-output table (``Output Cosine Similarity L1 Distance L2 Distance
Chebyshev Distance``), the calibration method ``default`` chose (``Select max-percentile:
percentile=0.99995 method.``), the int16 requests the parser accepted (``The input of node X
are set to : int16``), placement requests, and int16 fall-back messages.

Robust to what real logs do: columns are found from the header (any subset, in any order),
long node names are cut to ``...tail`` (matched by suffix later), a row wrapped over several
lines is joined until it has all its cells, Horizon-inserted rows and CPU rows carry ``--``,
log lines carry a ``date time file: x.py func: f line No: N`` prefix. A log holding several
conversions is read from its last one.

The exact text of the int16 fall-back message is not documented (reference 4.4); lines that
mention int16 together with a fall-back phrase are taken as refusals. The reliable evidence
is the table itself: a node asked for int16 whose DataType column shows no int16 was
refused, and :mod:`tuner.toolchain.compare` derives refusals that way.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import TunerError

_PREFIX = re.compile(r"^\s*\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[,.]\d+)?\s+"
                     r"(?:file:\s*\S+\s+func:\s*\S+\s+line No:\s*\d+\s*|(?:\[?(?:INFO|WARNING|WARN|ERROR|DEBUG)\]?\s+))?")
_TIMESTAMP = re.compile(r"^\s*\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")
_NODE_HEADER = re.compile(r"^[\s|]*Node[\s|]+ON[\s|]+Subgraph[\s|]+Type\b")
_OUTPUT_HEADER = re.compile(r"^[\s|]*Output[\s|]+Cosine\s+Similarity\b")
_RULE = re.compile(r"^\s*(=+|-+)\s*$")
_SELECT = re.compile(r"Select\s+(\S+?)\s+method\.?\s*$")
_SET_TO = re.compile(r"The (input|output) of node (.+?) (?:are|is) set to\s*:\s*(int8|int16)\b")
_SET_ALL = re.compile(r"The (input|output) of all (\S+) nodes (?:are|is) set to\s*:\s*(int8|int16)\b")
_DESIGNATED = re.compile(r"There are \d+ nodes designated to run on the (bpu|cpu)\s*:\s*\[(.*)\]", re.I)
_FALLBACK = re.compile(r"fall(?:s|ing)?[ -]?back|not support|unsupported|cannot|can't|(?:changed?|set|reset) to int8|"
                       r"ignored?", re.I)
_QUOTED = re.compile(r"""['"]([^'"]+)['"]""")
_NODE_WORD = re.compile(r"\bnode[s]?\s+(\S+)", re.I)
_VERSION = re.compile(r"\b(hb_mapper|hbdk|horizon_nn) version\s*:\s*(\S+)")
_MARCH = re.compile(r"compilation architecture:\s*(\S+?)\.?\s*$")
_SUCCESS = re.compile(r"Convert to runtime bin file successfully")
_ERROR = re.compile(r"(?:^|\s|\[)ERROR(?:\]|\s|:)")
_CONVERSION_END = re.compile(r"End Model Convert")
_LOGLIKE = re.compile(r"hb_mapper|horizon_nn|makertbin|hbdk", re.I)

#: header cell (lower case, spaces squeezed) -> field
_NODE_COLUMNS = {"node": "name", "on": "on", "subgraph": "subgraph", "type": "kernel",
                 "cosine similarity": "cosine", "threshold": "threshold", "datatype": "dtype",
                 "in/out datatype": "inout", "data type": "dtype"}
_OUTPUT_COLUMNS = {"output": "name", "cosine similarity": "cosine", "cosine": "cosine", "l1 distance": "l1",
                   "l1": "l1", "l2 distance": "l2", "l2": "l2", "chebyshev distance": "chebyshev",
                   "chebyshev": "chebyshev"}


@dataclass(frozen=True)
class NodeRecord:
    """One row of the node table. ``name`` as printed: a long name may be cut to ``...tail``."""

    name: str
    on: str                      # BPU | CPU
    subgraph: int | None         # id(n); None for CPU rows ('--')
    kernel: str                  # Horizon kernel (HzSQuantizedConv, HzLut, ...) or the ONNX op
    cosine: float | None         # node output vs float; None where the log prints '--'
    threshold: float | None
    in_dtype: str | None         # only older builds (In/Out DataType) print the input side
    out_dtype: str | None        # DataType, or the output side of In/Out DataType

    @property
    def truncated(self) -> bool:
        return self.name.startswith("...")

    def matches(self, node_name: str) -> bool:
        """Whether this row is ``node_name`` (a cut name matches by its tail)."""
        return name_matches(self.name, node_name)


def name_matches(printed: str, node_name: str) -> bool:
    """Whether a name as the log prints it is ``node_name`` (a cut ``...tail`` matches by its tail)."""
    if printed.startswith("..."):
        return len(printed) > 3 and node_name.endswith(printed[3:])
    return printed == node_name


@dataclass(frozen=True)
class OutputRecord:
    """One row of the model-output table."""

    name: str
    cosine: float | None
    l1: float | None = None
    l2: float | None = None
    chebyshev: float | None = None


@dataclass(frozen=True)
class Int16Event:
    """An int16 request the log mentions: ``set`` (parser accepted it) or ``refused`` (fall-back message)."""

    node: str
    side: str            # input | output | unknown
    status: str          # set | refused
    text: str


@dataclass
class HbLog:
    """What one conversion log says."""

    path: str | None
    nodes: list[NodeRecord] = field(default_factory=list)
    outputs: list[OutputRecord] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)         # the node table's header cells, as printed
    method: str | None = None                                 # 'max-percentile:percentile=0.99995' ('default' chose it)
    int16: list[Int16Event] = field(default_factory=list)
    int16_all: dict[str, str] = field(default_factory=dict)  # 'input of Softmax' -> int16 (set_{Op}_*)
    requested_bpu: list[str] = field(default_factory=list)
    requested_cpu: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    march: str | None = None
    succeeded: bool = False
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)        # about reading the log, not from it

    @property
    def has_tables(self) -> bool:
        return bool(self.nodes or self.outputs)

    @property
    def mean_output_cosine(self) -> float | None:
        values = [o.cosine for o in self.outputs if o.cosine is not None]
        return sum(values) / len(values) if values else None

    def rows_for(self, node_name: str) -> list[NodeRecord]:
        """The table rows of one model node: its own row, else rows hb_mapper split it into
        (``<name>_...``, e.g. a Softmax decomposed on the BPU)."""
        own = [r for r in self.nodes if r.matches(node_name)]
        if own:
            return own
        return [r for r in self.nodes if not r.truncated and r.name.startswith(node_name + "_")]

    def refused(self) -> list[Int16Event]:
        return [e for e in self.int16 if e.status == "refused"]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HbLog:
        d = dict(d)
        d["nodes"] = [NodeRecord(**n) for n in d.get("nodes", [])]
        d["outputs"] = [OutputRecord(**o) for o in d.get("outputs", [])]
        d["int16"] = [Int16Event(**e) for e in d.get("int16", [])]
        return cls(**d)


# --------------------------------------------------------------------------- parsing


def _message(line: str) -> str:
    return _PREFIX.sub("", line, count=1).rstrip()


def _number(cell: str) -> float | None:
    if cell in ("--", "-", "N/A", "None", ""):
        return None
    try:
        return float(cell)
    except ValueError:
        return None


def _header_fields(line: str, known: dict[str, str]) -> tuple[list[str], list[str]]:
    cells = [c.strip() for c in re.split(r"\s{2,}|\t|\s*\|\s*", line.strip()) if c.strip()]
    return [known.get(re.sub(r"\s+", " ", c.lower()), f"extra:{c}") for c in cells], cells


def _ends_table(line: str) -> bool:
    return not line.strip() or bool(_TIMESTAMP.match(line) or _RULE.match(line) or _NODE_HEADER.match(line)
                                    or _OUTPUT_HEADER.match(line))


def _row_cells(tokens: list[str], fields: list[str]) -> dict[str, str] | None:
    """field -> cell of one row; surplus tokens belong to the first cell (a name may hold spaces)."""
    extra = len(tokens) - len(fields)
    if extra < 0:
        return None
    return dict(zip(fields, [" ".join(tokens[: extra + 1])] + tokens[extra + 1:]))


def _node_row(tokens: list[str], fields: list[str]) -> NodeRecord | None:
    row = _row_cells(tokens, fields)
    if row is None:
        return None
    on = row.get("on", "")
    if on.upper() not in ("BPU", "CPU"):
        return None
    sub = row.get("subgraph")
    m = re.fullmatch(r"id\((\d+)\)", sub or "")
    if sub not in (None, "--") and not m:
        return None
    in_dt, out_dt = None, row.get("dtype")
    if "inout" in row:
        parts = row["inout"].split("/")
        in_dt, out_dt = (parts[0], parts[-1]) if len(parts) >= 2 else (None, parts[0])
    return NodeRecord(name=row["name"], on=on.upper(), subgraph=int(m.group(1)) if m else None,
                      kernel=row.get("kernel", ""), cosine=_number(row.get("cosine", "--")),
                      threshold=_number(row.get("threshold", "--")),
                      in_dtype=None if in_dt in (None, "--") else in_dt,
                      out_dtype=None if out_dt in (None, "--") else out_dt)


def _output_row(tokens: list[str], fields: list[str]) -> OutputRecord | None:
    row = _row_cells(tokens, fields)
    if row is None:
        return None
    values = {k: _number(row[k]) for k in ("cosine", "l1", "l2", "chebyshev") if k in row}
    if "cosine" in row and values["cosine"] is None and row["cosine"] not in ("--",):
        return None
    return OutputRecord(name=row["name"], **values)


def _cells(line: str) -> list[str]:
    """A row's cells; '|' column separators (some renderings of the tables) are dropped."""
    return [c for c in (t.strip("|") for t in line.split()) if c] if "|" in line else line.split()


def _table(lines: list[str], start: int, fields: list[str], make, what: str, warnings: list[str]) -> tuple[list, int]:
    """Rows from ``start`` until the table ends; wrapped rows are joined. Returns (rows, next index)."""
    rows, pending, i = [], [], start
    while i < len(lines) and _RULE.match(lines[i]):  # the rule under the header
        i += 1
    while i < len(lines):
        line = lines[i]
        if _ends_table(line):
            break
        tokens = _cells(line)
        pending += tokens
        if len(pending) >= len(fields):
            row = make(pending, fields)
            if row is None:
                if len(pending) == len(tokens):   # a whole line that is no row: the table is over
                    pending = []
                    break
                warnings.append(f"{what}: could not read the row {' '.join(pending)!r}; skipped")
            else:
                rows.append(row)
            pending = []
        i += 1
    if pending:
        warnings.append(f"{what}: the last row is incomplete ({' '.join(pending)!r}); skipped")
    return rows, i


def _names(text: str) -> list[str]:
    return [n.strip().strip("'\"") for n in text.split(",") if n.strip().strip("'\"")]


def _last_conversion(lines: list[str], warnings: list[str]) -> list[str]:
    ends = [i for i, line in enumerate(lines) if _CONVERSION_END.search(line)]
    tables = [i for i, line in enumerate(lines) if _NODE_HEADER.match(_message(line))]
    if len(ends) < 2 or len(tables) < 2:
        return lines
    cut = max((e for e in ends if e < tables[-1]), default=-1)
    warnings.append(f"the log holds {len(ends)} conversions; read the last one (from line {cut + 2})")
    return lines[cut + 1:]


def parse_log(text: str, path: str | None = None) -> HbLog:
    """Parse a conversion log's text. Raises TunerError when it is no hb_mapper makertbin log."""
    where = path or "the log"
    if "\x00" in text[:4096]:
        raise TunerError(f"{where}: a binary file, not an hb_mapper makertbin log; pass hb_mapper_makertbin.log "
                         "(written where you ran hb_mapper)")
    log = HbLog(path=path)
    lines = _last_conversion(text.splitlines(), log.warnings)
    i = 0
    while i < len(lines):
        msg = _message(lines[i])
        if _NODE_HEADER.match(msg):
            fields, cells = _header_fields(msg, _NODE_COLUMNS)
            if "name" not in fields or "on" not in fields:
                log.warnings.append(f"node table header not understood: {msg.strip()!r}")
                i += 1
                continue
            log.columns = cells
            rows, i = _table(lines, i + 1, fields, _node_row, "node table", log.warnings)
            log.nodes = rows   # the last table wins (checker-style tables may come first)
            continue
        if _OUTPUT_HEADER.match(msg):
            fields, _ = _header_fields(msg, _OUTPUT_COLUMNS)
            rows, i = _table(lines, i + 1, fields, _output_row, "output table", log.warnings)
            log.outputs = rows
            continue
        m = _SELECT.search(msg)
        if m:
            log.method = m.group(1)
        m = _SET_TO.search(msg)
        if m:
            if m.group(3) == "int16":
                log.int16.append(Int16Event(node=m.group(2).strip().strip("'\""), side=m.group(1), status="set",
                                            text=msg.strip()))
        elif "int16" in msg.lower() and _FALLBACK.search(msg):
            named = _QUOTED.findall(msg) or [n.rstrip(".,:;") for n in _NODE_WORD.findall(msg)]
            side = "input" if re.search(r"\binput", msg, re.I) else "output" if re.search(r"\boutput", msg, re.I) \
                else "unknown"
            for node in named or ["?"]:
                log.int16.append(Int16Event(node=node, side=side, status="refused", text=msg.strip()))
        m = _SET_ALL.search(msg)
        if m:
            log.int16_all[f"{m.group(1)} of {m.group(2)}"] = m.group(3)
        m = _DESIGNATED.search(msg)
        if m:
            (log.requested_bpu if m.group(1).lower() == "bpu" else log.requested_cpu).extend(_names(m.group(2)))
        for m in _VERSION.finditer(msg):
            log.versions[m.group(1)] = m.group(2)
        m = _MARCH.search(msg)
        if m:
            log.march = m.group(1)
        if _SUCCESS.search(msg):
            log.succeeded = True
        if _ERROR.search(lines[i]):
            log.errors.append(msg.strip())
        i += 1
    if not log.has_tables and log.method is None and not log.int16 and not log.versions and not _LOGLIKE.search(text):
        raise TunerError(f"{where}: not an hb_mapper makertbin log (no node table 'Node ON Subgraph Type ...', no "
                         "output table, no 'Select ... method.' line); pass hb_mapper_makertbin.log, written in the "
                         "folder hb_mapper was started from")
    log.errors = log.errors[-10:]
    return log


def read_log(path: str | Path) -> HbLog:
    """Parse a log file; a missing or unreadable file is a TunerError."""
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"{path}: no such file; hb_mapper writes hb_mapper_makertbin.log in the folder it was "
                         "started from")
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise TunerError(f"{path}: cannot read: {exc}") from None
    return parse_log(text, str(path))


def require_tables(log: HbLog) -> HbLog:
    """The log must hold the node or the output table (else the conversion did not get that far)."""
    if not log.has_tables:
        why = f" (last error: {log.errors[-1]})" if log.errors else ""
        raise TunerError(f"{log.path or 'the log'}: an hb_mapper log without the node and output tables: the "
                         f"conversion did not finish{why}; fix that error and convert again")
    return log
