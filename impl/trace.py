"""NDJSON action traces (format ``accelpact-trace/1``, spec/implementation.md "Trace format").

One file per rank and attempt.  Every record is written and flushed with one ``write``
on an unbuffered file descriptor, so a SIGKILL loses nothing already written.  Writes
are serialised by a lock because the watchdog thread writes ``RankExit`` too; ``seq``
is assigned under the same lock, so it is gap-free in file order.

``NullTrace`` is the default: every method is a no-op (tracing costs nothing when off).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from accelpact.model.protocol import ACTIONS

from .rundir import RunDir

__all__ = ["FORMAT", "NullTrace", "RankTrace", "Record", "Trace", "TraceError", "load_traces", "parse_trace", "trace_path"]

FORMAT = "accelpact-trace/1"
OUTCOMES = ("ok", "fail", "info")


def trace_path(directory: str | os.PathLike, attempt: int, rank: int) -> Path:
    """This rank's trace file in run folder ``directory`` (:meth:`accelpact.impl.rundir.RunDir.trace`)."""
    return RunDir(directory).trace(attempt, rank)


class NullTrace:
    """Tracing off: nothing is written."""

    enabled = False

    def action(self, action: str, gen: int, outcome: str = "ok", state: dict | None = None, detail: dict | None = None) -> None:
        return None

    def note(self, what: str, **detail: Any) -> None:
        return None

    def end(self, outcome: str, **detail: Any) -> None:
        return None

    def close(self) -> None:
        return None


class Trace:
    """Per-rank NDJSON writer.  The header is written at construction.

    ``header`` supplies the fields of the header record (world, nodes, ranks_per_node, group,
    affected, attempt, scenario, seed, backend, frontier_at_start); ``format``, ``type`` and
    ``rank`` are filled in here.
    """

    enabled = True

    def __init__(self, path: str | os.PathLike, rank: int, header: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.rank = rank
        self._lock = threading.Lock()
        self._seq = 0
        self._ended = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        head = {"type": "header", "format": FORMAT, "rank": rank}
        head.update(header or {})
        head["rank"] = rank
        self._write(head)

    def _write(self, rec: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode())

    def action(self, action: str, gen: int, outcome: str = "ok", state: dict | None = None, detail: dict | None = None) -> None:
        """One record per model action; ``state`` is the post-state in model vocabulary."""
        if action not in ACTIONS:
            raise ValueError(f"trace: {action!r} is not a model action; use a name from accelpact.model.protocol.ACTIONS")
        if outcome not in OUTCOMES:
            raise ValueError(f"trace: outcome {outcome!r} must be one of {OUTCOMES}")
        with self._lock:
            if self._ended or self._fd < 0:
                return
            rec = {
                "type": "action", "seq": self._seq, "rank": self.rank, "action": action, "gen": gen,
                "outcome": outcome, "t_ns": time.monotonic_ns(), "state": state or {}, "detail": detail or {},
            }
            self._write(rec)
            self._seq += 1

    def note(self, what: str, **detail: Any) -> None:
        """A record that is not a model action (``type: note``; the checker skips it): what a
        watcher thread did, for diagnosis (e.g. ``revoke``: sockets shut down)."""
        with self._lock:
            if self._ended or self._fd < 0:
                return
            self._write({"type": "note", "rank": self.rank, "note": what, "t_ns": time.monotonic_ns(), **detail})

    def end(self, outcome: str, **detail: Any) -> None:
        """The final record (``released`` or ``exited``); later writes are ignored."""
        with self._lock:
            if self._ended or self._fd < 0:
                return
            self._ended = True
            self._write({"type": "end", "rank": self.rank, "outcome": outcome, "t_ns": time.monotonic_ns(), **detail})

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


# ----------------------------------------------------------------------------------------- reading
class TraceError(ValueError):
    """A trace file is malformed (not a conformance verdict): names the file, line and field."""


@dataclass(frozen=True, slots=True)
class Record:
    """One action record, as the checker reads it."""

    rank: int
    seq: int
    action: str
    gen: int
    outcome: str
    t_ns: int
    state: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    detail: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __str__(self) -> str:
        st = ", ".join(f"{k}={v}" for k, v in self.state.items())
        return f"r{self.rank}#{self.seq} {self.action} gen={self.gen} {self.outcome} [{st}]"

    def to_json(self) -> dict[str, Any]:
        return {"type": "action", "seq": self.seq, "rank": self.rank, "action": self.action, "gen": self.gen,
                "outcome": self.outcome, "t_ns": self.t_ns, "state": dict(self.state), "detail": dict(self.detail)}


@dataclass(slots=True)
class RankTrace:
    """One rank's records of one attempt, plus its header and ``end`` record (None if absent)."""

    rank: int
    records: list[Record]
    header: dict[str, Any] = field(default_factory=dict)
    end: dict[str, Any] | None = None


def parse_trace(lines: Iterable[str], source: str, *, complete: bool = True) -> RankTrace:
    """Parse one rank's trace (format :data:`FORMAT`); :class:`TraceError` names file, line and field.

    Every line must be a record: a line that is not JSON is a rejection, except the last line of
    an incomplete file (``complete=False``: the file does not end with a newline), which is a
    write cut short by a kill and is dropped."""
    header: dict[str, Any] | None = None
    records: list[Record] = []
    end = None
    lines = list(lines)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == len(lines) and not complete and n > 1:
                break  # a write cut short by a kill: the file has no final newline
            raise TraceError(f"{source}:{n}: not JSON ({exc.msg}); a trace line is never partial except "
                             "the unterminated last line of a killed rank") from exc
        kind = obj.get("type")
        if kind == "header":
            if obj.get("format") != FORMAT:
                raise TraceError(f"{source}:{n}: header.format must be {FORMAT!r}, got {obj.get('format')!r}")
            header = obj
        elif kind == "action":
            if header is None:
                raise TraceError(f"{source}:{n}: an action record before the header")
            for k in ("seq", "rank", "action", "gen"):
                if k not in obj:
                    raise TraceError(f"{source}:{n}: action record lacks field {k!r}")
            if obj["action"] not in ACTIONS:
                raise TraceError(f"{source}:{n}: action {obj['action']!r} is not a model action (model.protocol.ACTIONS)")
            records.append(Record(int(obj["rank"]), int(obj["seq"]), obj["action"], int(obj["gen"]), obj.get("outcome", "ok"),
                                  int(obj.get("t_ns", 0)), obj.get("state") or {}, obj.get("detail") or {}))
        elif kind == "end":
            end = obj
        elif kind == "note":
            continue  # not a model action: a watcher's diagnostic (Trace.note)
        else:
            raise TraceError(f"{source}:{n}: unknown record type {kind!r} (header, action, note, end)")
    if header is None:
        raise TraceError(f"{source}: no header record")
    rank = int(header["rank"])
    for i, rec in enumerate(records):
        if rec.seq != i:
            raise TraceError(f"{source}: seq must be gap-free from 0; record {i} has seq {rec.seq}")
        if rec.rank != rank:
            raise TraceError(f"{source}: record seq {rec.seq} names rank {rec.rank} in rank {rank}'s trace")
    return RankTrace(rank, records, header, end)


def load_traces(path: str | os.PathLike) -> dict[int, dict[int, RankTrace]]:
    """attempt -> rank -> trace, every trace file of run folder ``path`` parsed strictly.

    A rank's trace is its identity's: where spares took the identity (hot swap), the traces of its
    incarnations are joined in the order they held it (the first process's file, then each spare's
    by the generation it joined in), records renumbered gap-free, with the first file's header and
    the last one's ``end`` record.  Each incarnation before the last must end where a successor can
    take the identity: with no ``end`` record (it died)."""
    run = RunDir(path)
    files = run.trace_files()
    if not files:
        raise TraceError(f"{path}: no trace-a*-r*.ndjson files (run a scenario with tracing on, or name the right folder)")
    out: dict[int, dict[int, RankTrace]] = {}
    for (attempt, rank), f in sorted(files.items()):
        out.setdefault(attempt, {})[rank] = _read_trace(f, rank)
    for (attempt, rank), spares in sorted(run.spare_trace_files().items()):
        first = out.get(attempt, {}).get(rank)
        if first is None:
            names = ", ".join(p.name for p in spares.values())
            raise TraceError(f"{path}: {names} took rank {rank}'s identity in attempt {attempt}, but "
                             f"{run.trace(attempt, rank).name} is missing")
        later = sorted((_read_trace(p, rank) for p in spares.values()), key=_joined_generation)
        out[attempt][rank] = _join(first, later)
    return out


def _read_trace(f: Path, rank: int) -> RankTrace:
    text = f.read_text()
    tr = parse_trace(text.splitlines(), str(f), complete=text.endswith("\n"))
    if tr.rank != rank:
        raise TraceError(f"{f}: header says rank {tr.rank}, file name says {rank}")
    tr.header.setdefault("source", str(f))
    return tr


def _joined_generation(tr: RankTrace) -> tuple[int, int]:
    """When a spare's incarnation took the identity: the generation of its first record."""
    gen = tr.records[0].gen if tr.records else int(tr.header.get("generation_at_start", 0))
    return gen, int(tr.header.get("spare", 0))


def _join(first: RankTrace, later: list[RankTrace]) -> RankTrace:
    records = list(first.records)
    prev = first
    for tr in later:
        if prev.end is not None:
            raise TraceError(f"{tr.header.get('source')}: a spare took rank {first.rank}'s identity, but the "
                             f"incarnation before it ({prev.header.get('source')}) ended with an end record "
                             f"({prev.end.get('outcome')!r}): only a process that died hands its identity on")
        base = len(records)
        records += [replace(rec, seq=base + rec.seq) for rec in tr.records]
        prev = tr
    header = {**first.header, "incarnations": [tr.header for tr in later]}
    return RankTrace(first.rank, records, header, prev.end)
