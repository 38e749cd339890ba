"""Read hb_mapper makertbin's conversion log (docs/hb_rules/config.md §7) into typed records.

What the log holds and tuner uses: the per-node table (``Node ON Subgraph Type Cosine
Similarity Threshold DataType``; older builds print ``In/Out DataType`` such as
``int8/int32``), the model-output table (``Output Cosine Similarity L1 Distance L2 Distance
Chebyshev Distance``), the calibration method ``default`` chose (``Select max-percentile:
percentile=0.99995 method.``), the int16 requests the parser accepted (``The input of node X
are set to : int16``), placement requests, and int16 fall-back messages.

Robust to what real logs of every version do: columns are found from the header (any subset,
in any order) and cells are read by the header's column positions (the tables are fixed-width;
hb_mapper <= 1.23 leaves cells blank where newer builds print ``--``), long node names are cut
to ``...tail`` (matched by suffix later), a row wrapped over several lines is joined, older
builds head the output table ``Node`` instead of ``Output`` and spell the success line
``sucessfully``, log lines carry a ``date time file: x.py func: f line No: N`` prefix. A row
that cannot be read is skipped with a warning naming its line, never merged with the next.
A log holding several conversions is read from its last one.

The exact text of the int16 fall-back message is not documented (docs/hb_rules/ops.md §3); lines that
mention int16 together with a fall-back phrase are taken as refusals. The reliable evidence
is the table itself: a node asked for int16 whose DataType column shows no int16 was
refused, and :mod:`tuner.toolchain.compare` derives refusals that way.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import TunerError

_PREFIX = re.compile(r"^\s*\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[,.]\d+)?\s+"
                     r"(?:file:\s*\S+\s+func:\s*\S+\s+line No:\s*\d+\s*|(?:\[?(?:INFO|WARNING|WARN|ERROR|DEBUG)\]?\s+))?")
_TIMESTAMP = re.compile(r"^\s*\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")
_NODE_HEADER = re.compile(r"^[\s|]*Node[\s|]+ON[\s|]+Subgraph[\s|]+Type\b")
# hb_mapper >= 1.24 heads the output table 'Output', older builds 'Node' (the node producing each output)
_OUTPUT_HEADER = re.compile(r"^[\s|]*(?:Output|Node)[\s|]+Cosine\s+Similarity\b")
_RULE = re.compile(r"^\s*(=+|-+)\s*$")
_SELECT = re.compile(r"Select\s+(\S+?)\s+method\.?\s*$")
_SET_TO = re.compile(r"The (input|output) of node (.+?) (?:are|is) set to\s*:\s*(int8|int16)\b")
_SET_ALL = re.compile(r"The (input|output) of all (\S+) nodes (?:are|is) set to\s*:\s*(int8|int16)\b")
_DESIGNATED = re.compile(r"There are \d+ nodes designated to run on the (bpu|cpu)\s*:\s*\[(.*)\]", re.I)
_FALLBACK = re.compile(r"fall(?:s|ing)?[ -]?back|not support|unsupported|cannot|can't|(?:changed?|set|reset) to int8|"
                       r"ignored?", re.I)
_QUOTED = re.compile(r"""['"]([^'"]+)['"]""")
_NODE_WORD = re.compile(r"\bnode[s]?\s+(\S+)", re.I)
_VERSION = re.compile(r"\b(hb_mapper|hbdk|horizon_nn) version\s*:?\s*(\d\S*)")
# 'The specified model compilation architecture: bayes-e.' (1.24); 'Start to compile the model with
# march bernoulli2.' (every version); 'BPU march           : bayes' (model_parameters info)
_MARCH = re.compile(r"(?:compilation architecture:|Start to compile the model with march|\bBPU march\s*:)"
                    r"\s*(\S+?)\.?\s*$")
# 'sucessfully' is how the X3-era tools spell it
_SUCCESS = re.compile(r"Convert to runtime bin file succ?ess?fully")
_ERROR = re.compile(r"(?:^|\s|\[)ERROR(?:\]|\s|:)")
_CONVERSION_END = re.compile(r"End Model Convert")
_LOGLIKE = re.compile(r"hb_mapper|horizon_nn|makertbin|hbdk", re.I)

#: header cell (lower case, spaces squeezed) -> field
_NODE_COLUMNS = {"node": "name", "on": "on", "subgraph": "subgraph", "type": "kernel",
                 "cosine similarity": "cosine", "threshold": "threshold", "datatype": "dtype",
                 "in/out datatype": "inout", "data type": "dtype"}
_OUTPUT_COLUMNS = {"output": "name", "node": "name", "cosine similarity": "cosine", "cosine": "cosine", "l1 distance": "l1",
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


def part_of(printed: str, node_name: str) -> bool:
    """Whether a name as the log prints it is a row hb_mapper split ``node_name`` into:
    ``<node_name>_<part>`` (``/attn/Softmax_reducemax_FROM_QUANTIZED_SOFTMAX``,
    ``/Split_output_0_calibrated_Requantize``). A cut ``...tail`` is the same rule as
    :func:`name_matches`: the tail up to one of its ``_`` is the end of ``node_name``."""
    if not printed.startswith("..."):
        return printed.startswith(node_name + "_")
    tail = printed[3:]
    return any(tail[:k] and node_name.endswith(tail[:k]) for k in (m.start() for m in re.finditer("_", tail)))


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
    outputs_by: str = "output"     # what the output table's names are: model outputs, or (before 1.24) their nodes
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

    def rows_for(self, node_name: str, model_nodes: Iterable[str] = ()) -> list[NodeRecord]:
        """The table rows of one model node: its own row, else rows hb_mapper split it into
        (``<name>_...``, cut or not, e.g. an int16 Softmax decomposed into six rows on the BPU).
        A row that is another of ``model_nodes`` (``/a/Conv_1`` for ``/a/Conv``), or a part of a
        longer one (``/a/Conv_1_output_0_pad``), is not a part of this node."""
        own = [r for r in self.nodes if r.matches(node_name)]
        if own:
            return own
        others = [n for n in model_nodes if n != node_name]
        return [r for r in self.nodes if part_of(r.name, node_name)
                and not any(r.matches(o) or (len(o) > len(node_name) and part_of(r.name, o)) for o in others)]

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


_HEADER_CELL = re.compile(r"[^\s|](?:[^\s|]| (?=[^\s|]))*")   # header cells: words joined by single spaces
_TOKEN = re.compile(r"\S+")


@dataclass
class _Header:
    fields: list[str]        # field per column
    cells: list[str]         # the header's cells as printed
    starts: list[int]        # where each column begins (fixed-width tables)
    positional: bool         # False for '|' or tab separated renderings: cells are read as tokens


def _header(line: str, known: dict[str, str]) -> _Header:
    found = list(_HEADER_CELL.finditer(line))
    cells = [m.group() for m in found]
    fields = [known.get(re.sub(r"\s+", " ", c.lower()), f"extra:{c}") for c in cells]
    return _Header(fields, cells, [m.start() for m in found], positional="|" not in line and "\t" not in line)


def _ends_table(line: str) -> bool:
    return not line.strip() or bool(_TIMESTAMP.match(line) or _RULE.match(line) or _NODE_HEADER.match(line)
                                    or _OUTPUT_HEADER.match(line))


def _place(line: str, starts: list[int]) -> tuple[dict[int, str], bool]:
    """A fixed-width line's cells by column (a cell belongs to the column it starts in; blank cells
    are absent), and whether the line is aligned with the header: no cell runs into the next
    column and no column other than the first holds two words."""
    cells: dict[int, str] = {}
    aligned, prev = True, None
    for m in _TOKEN.finditer(line):
        col = max(bisect_right(starts, m.start()) - 1, 0)
        if prev is not None and ((col == prev[0] and col != 0) or (col > prev[0] and prev[1] > starts[col])):
            aligned = False
        cells[col] = f"{cells[col]} {m.group()}" if col in cells else m.group()
        prev = (col, m.end())
    return cells, aligned


def _number_cell(cell: str | None) -> tuple[bool, float | None]:
    """(readable, value) of a numeric cell: blank and '--' are readable and None."""
    if cell is None or cell in ("--", "-", "N/A", "None", ""):
        return True, None
    try:
        return True, float(cell)
    except ValueError:
        return False, None


def _node_row(row: dict[str, str]) -> NodeRecord | None:
    name, on = row.get("name", ""), row.get("on", "").upper()
    if not name or on not in ("BPU", "CPU"):
        return None
    sub = row.get("subgraph")
    m = re.fullmatch(r"id\((\d+)\)", sub or "")
    if sub not in (None, "--") and not m:
        return None
    (ok_c, cosine), (ok_t, threshold) = _number_cell(row.get("cosine")), _number_cell(row.get("threshold"))
    if not (ok_c and ok_t):
        return None
    in_dt, out_dt = None, row.get("dtype")
    if "inout" in row:
        parts = row["inout"].split("/")
        in_dt, out_dt = (parts[0], parts[-1]) if len(parts) >= 2 else (None, parts[0])
    return NodeRecord(name=name, on=on, subgraph=int(m.group(1)) if m else None, kernel=row.get("kernel", ""),
                      cosine=cosine, threshold=threshold, in_dtype=None if in_dt in (None, "--") else in_dt,
                      out_dtype=None if out_dt in (None, "--") else out_dt)


def _output_row(row: dict[str, str]) -> OutputRecord | None:
    if not row.get("name"):
        return None
    values = {}
    for k in ("cosine", "l1", "l2", "chebyshev"):
        if k in row:
            ok, values[k] = _number_cell(row[k])
            if not ok:
                return None
    if values.get("cosine") is None and all(v is None for v in values.values()):
        return None
    return OutputRecord(name=row["name"], **values)


def _is_node_line(tokens: list[str]) -> bool:
    return any(t.upper() in ("BPU", "CPU") for t in tokens)


def _is_output_line(tokens: list[str]) -> bool:
    return any(_number_cell(t)[1] is not None for t in tokens[1:])


def _separated(line: str) -> list[str]:
    """The cells of a '|' or tab separated line (blank cells kept)."""
    cells = [c.strip() for c in re.split(r"\||\t", line.strip())]
    if "|" in line and cells and not cells[0]:
        cells = cells[1:]
    if "|" in line and cells and not cells[-1]:
        cells = cells[:-1]
    return cells


@dataclass
class _Pending:
    line: int                       # first line, 1-based in the file
    tokens: list[str]
    cells: dict[int, str]
    aligned: bool


def _table(lines: list[str], start: int, header: _Header, make, is_row_line, what: str, warnings: list[str],
           offset: int = 0) -> tuple[list, int]:
    """Rows from ``start`` until the table ends. Returns (rows, next index).

    Fixed-width tables are read by the header's column positions: a blank cell (hb_mapper <= 1.23
    prints blank cosine/threshold cells on inserted rows) stays blank instead of taking the next
    line's cells, and a line whose first column is blank continues the row above (a wrapped row).
    A line the columns do not explain is read by its words when it has one per column; a row read
    neither way is skipped with a warning naming its line (1-based in the file: ``offset`` is the
    index of ``lines[0]`` there). '|' or tab separated renderings are split at their separators."""
    fields = header.fields
    rows: list = []
    i = start
    while i < len(lines) and _RULE.match(lines[i]):  # the rule under the header
        i += 1

    def finish(p: _Pending | None) -> None:
        if p is None:
            return
        row = make({fields[c]: t for c, t in p.cells.items()}) if p.aligned else None
        if row is None and len(p.tokens) == len(fields):   # not aligned, but one word per column
            row = make(dict(zip(fields, p.tokens)))
        if row is None:
            warnings.append(f"{what}: line {p.line}: could not read the row {' '.join(p.tokens)!r}; skipped")
        else:
            rows.append(row)

    if not header.positional:
        while i < len(lines) and not _ends_table(lines[i]):
            separated = _separated(lines[i])
            if not is_row_line(lines[i].replace("|", " ").split()):
                break
            row = make(dict(zip(fields, separated))) if len(separated) == len(fields) else None
            if row is None:
                warnings.append(f"{what}: line {i + offset + 1}: could not read the row {lines[i].strip()!r}; skipped")
            else:
                rows.append(row)
            i += 1
        return rows, i

    pending: _Pending | None = None
    while i < len(lines):
        line = lines[i]
        if _ends_table(line):
            break
        cells, aligned = _place(line, header.starts)
        tokens = line.split()
        if 0 not in cells and pending is not None and not (cells.keys() & pending.cells.keys()) and (
                make({fields[c]: t for c, t in (pending.cells | cells).items()}) is not None
                or make({fields[c]: t for c, t in pending.cells.items()}) is None):
            pending.cells.update(cells)          # a wrapped row: its other cells on this line
            pending.tokens += tokens
            pending.aligned = pending.aligned and aligned
            i += 1
            continue
        continues = i + 1 < len(lines) and not _ends_table(lines[i + 1]) and \
            0 not in _place(lines[i + 1], header.starts)[0]
        if not is_row_line(tokens) and not continues:
            break                                # a line that is no row: the table is over
        finish(pending)
        pending = _Pending(i + offset + 1, tokens, cells, aligned)
        i += 1
    finish(pending)
    return rows, i


def _names(text: str) -> list[str]:
    return [n.strip().strip("'\"") for n in text.split(",") if n.strip().strip("'\"")]


def _last_conversion(lines: list[str], warnings: list[str]) -> tuple[list[str], int]:
    """The lines of the log's last conversion and the index of its first line in the file."""
    ends = [i for i, line in enumerate(lines) if _CONVERSION_END.search(line)]
    tables = [i for i, line in enumerate(lines) if _NODE_HEADER.match(_message(line))]
    if len(ends) < 2 or len(tables) < 2:
        return lines, 0
    cut = max((e for e in ends if e < tables[-1]), default=-1)
    warnings.append(f"the log holds {len(ends)} conversions; read the last one (from line {cut + 2})")
    return lines[cut + 1:], cut + 1


def parse_log(text: str, path: str | None = None) -> HbLog:
    """Parse a conversion log's text. Raises TunerError when it is no hb_mapper makertbin log."""
    where = path or "the log"
    if "\x00" in text[:4096]:
        raise TunerError(f"{where}: a binary file, not an hb_mapper makertbin log; pass hb_mapper_makertbin.log "
                         "(written where you ran hb_mapper)")
    log = HbLog(path=path)
    lines, offset = _last_conversion(text.splitlines(), log.warnings)
    i = 0
    while i < len(lines):
        msg = _message(lines[i])
        if _NODE_HEADER.match(msg):
            header = _header(msg, _NODE_COLUMNS)
            if "name" not in header.fields or "on" not in header.fields:
                log.warnings.append(f"node table header not understood: {msg.strip()!r}")
                i += 1
                continue
            log.columns = header.cells
            rows, i = _table(lines, i + 1, header, _node_row, _is_node_line, "node table", log.warnings, offset)
            log.nodes = rows   # the last table wins (checker-style tables may come first)
            continue
        if _OUTPUT_HEADER.match(msg):
            header = _header(msg, _OUTPUT_COLUMNS)
            rows, i = _table(lines, i + 1, header, _output_row, _is_output_line, "output table", log.warnings, offset)
            log.outputs = rows
            log.outputs_by = "node" if header.cells[0].lower() == "node" else "output"
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
