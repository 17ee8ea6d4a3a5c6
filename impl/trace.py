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
from pathlib import Path
from typing import Any

from accelpact.model.protocol import ACTIONS

__all__ = ["FORMAT", "Trace", "NullTrace", "trace_path"]

FORMAT = "accelpact-trace/1"
OUTCOMES = ("ok", "fail", "info")


def trace_path(directory: str | os.PathLike, attempt: int, rank: int) -> Path:
    """``trace-a{attempt}-r{rank}.ndjson`` inside ``directory``."""
    return Path(directory) / f"trace-a{attempt}-r{rank}.ndjson"


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
