"""The run folder: every file a job writes, named in one place (spec/implementation.md, "Run folder").

::

    <out>/job.json                       the job (impl/launch/job.py)
    <out>/trace-a{attempt}-r{rank}.ndjson per-rank action trace (impl/trace.py), when job.trace
    <out>/spare{k}-trace-a{attempt}-r{rank}.ndjson  spare k's trace once it took rank's identity (hot swap)
    <out>/result-a{attempt}-r{rank}.json  per-rank outcome and events (repairs, checkpoints), rewritten atomically
    <out>/spare{k}-result-a{attempt}.json spare k's outcome while it waits as a spare (then it writes its rank's)
    <out>/steps-a{attempt}-r{rank}.ndjson per-rank committed steps, one line each, append-only
    <out>/memory-a{attempt}-r{rank}.ndjson per-rank peak memory per step, append-only, when the workload
                                         asks (``Workload.memory``; a spare in rank's identity appends its own)
    <out>/final-r{rank}.pt                per-rank snapshot at the end (bit-identity checks)
    <out>/ckpt/                           durable DCP checkpoints (impl/runtime/checkpoint.py)
    <out>/torchrun.log, local-a{a}.log    the launchers' combined worker output
    <out>/DONE                            a finished reference run (impl/launch/launch.py)
    <out>/report-timeline.png             ``accelpact report``'s timeline (impl/launch/report.py)

Readers go through :class:`RunDir`; nobody else spells a file name or a glob.  Torch-free, and it
imports nothing of the package: the engine (its trace writer) and the launcher both name files here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

__all__ = ["RunDir"]

_TRACE = re.compile(r"^trace-a(\d+)-r(\d+)\.ndjson$")
_SPARE_TRACE = re.compile(r"^spare(\d+)-trace-a(\d+)-r(\d+)\.ndjson$")
_RESULT = re.compile(r"^result-a(\d+)-r(\d+)\.json$")
_SPARE_RESULT = re.compile(r"^spare(\d+)-result-a(\d+)\.json$")
_STEPS = re.compile(r"^steps-a(\d+)-r(\d+)\.ndjson$")
_MEMORY = re.compile(r"^memory-a(\d+)-r(\d+)\.ndjson$")


class RunDir:
    """The files of one run folder (see the module doc)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ---- names --------------------------------------------------------------------------------
    @property
    def job(self) -> Path:
        return self.path / "job.json"

    def trace(self, attempt: int, rank: int) -> Path:
        return self.path / f"trace-a{attempt}-r{rank}.ndjson"

    def spare_trace(self, spare: int, attempt: int, rank: int) -> Path:
        """Spare ``spare``'s trace as rank ``rank``, whose identity it took (its next incarnation)."""
        return self.path / f"spare{spare}-trace-a{attempt}-r{rank}.ndjson"

    def result(self, attempt: int, rank: int) -> Path:
        return self.path / f"result-a{attempt}-r{rank}.json"

    def spare_result(self, spare: int, attempt: int) -> Path:
        """Spare ``spare``'s outcome in ``attempt`` while it has not taken an identity."""
        return self.path / f"spare{spare}-result-a{attempt}.json"

    def steps(self, attempt: int, rank: int) -> Path:
        return self.path / f"steps-a{attempt}-r{rank}.ndjson"

    def memory(self, attempt: int, rank: int) -> Path:
        """Rank ``rank``'s peak-memory windows (:mod:`accelpact.testing.memory`): every process that held
        the identity in ``attempt`` appends to it (a spare after the rank it replaced), each line naming its pid."""
        return self.path / f"memory-a{attempt}-r{rank}.ndjson"

    def final(self, rank: int) -> Path:
        return self.path / f"final-r{rank}.pt"

    @property
    def ckpt(self) -> Path:
        return self.path / "ckpt"

    @property
    def torchrun_log(self) -> Path:
        return self.path / "torchrun.log"

    def local_log(self, attempt: int) -> Path:
        return self.path / f"local-a{attempt}.log"

    @property
    def done(self) -> Path:
        return self.path / "DONE"

    @property
    def report_png(self) -> Path:
        return self.path / "report-timeline.png"

    # ---- listing ------------------------------------------------------------------------------
    @staticmethod
    def result_name(name: str) -> tuple[str, int, int] | None:
        """What the file ``name`` of a run folder is, if a result file: ``("rank", attempt, rank)``
        (:meth:`result`) or ``("spare", attempt, spare)`` (:meth:`spare_result`); else None.  For a
        reader that lists the folder itself (the soak's live view, many times a second)."""
        if m := _RESULT.match(name):
            return "rank", int(m.group(1)), int(m.group(2))
        if m := _SPARE_RESULT.match(name):
            return "spare", int(m.group(2)), int(m.group(1))
        return None

    def _indexed(self, pattern: re.Pattern[str]) -> Iterator[tuple[int, int, Path]]:
        if not self.path.is_dir():
            return
        for p in sorted(self.path.iterdir()):
            m = pattern.match(p.name)
            if m:
                yield int(m.group(1)), int(m.group(2)), p

    def trace_files(self) -> dict[tuple[int, int], Path]:
        """(attempt, rank) -> trace file."""
        return {(a, r): p for a, r, p in self._indexed(_TRACE)}

    def spare_trace_files(self) -> dict[tuple[int, int], dict[int, Path]]:
        """(attempt, rank) -> spare -> the trace that spare wrote as that rank (hot swap)."""
        out: dict[tuple[int, int], dict[int, Path]] = {}
        if self.path.is_dir():
            for p in sorted(self.path.iterdir()):
                m = _SPARE_TRACE.match(p.name)
                if m:
                    out.setdefault((int(m.group(2)), int(m.group(3))), {})[int(m.group(1))] = p
        return out

    def memory_files(self) -> dict[tuple[int, int], Path]:
        """(attempt, rank) -> peak-memory file."""
        return {(a, r): p for a, r, p in self._indexed(_MEMORY)}

    def results(self) -> dict[tuple[int, int], dict[str, Any]]:
        """(attempt, rank) -> parsed result file (a file being replaced at this instant is skipped)."""
        out: dict[tuple[int, int], dict[str, Any]] = {}
        for a, r, p in self._indexed(_RESULT):
            try:
                out[(a, r)] = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
        for a, r, p in self._indexed(_STEPS):
            if (a, r) in out:
                losses, t_steps = self._step_lines(p)
                out[(a, r)].update(losses=losses, t_steps=t_steps)
        return out

    @staticmethod
    def _step_lines(path: Path) -> tuple[dict[str, float], dict[str, float]]:
        """``losses`` and ``t_steps`` (step, as a string -> value) from a steps file; a last line
        still being written is left out."""
        losses: dict[str, float] = {}
        t_steps: dict[str, float] = {}
        try:
            text = path.read_text()
        except OSError:
            return losses, t_steps
        for line in text.splitlines():
            try:
                rec = json.loads(line)
                step, loss, t = str(int(rec["step"])), float(rec["loss"]), float(rec["t"])
            except (ValueError, KeyError, TypeError):
                continue
            losses[step], t_steps[step] = loss, t
        return losses, t_steps

    def records(self, attempt: int, rank: int) -> list[dict[str, Any]]:
        """The records of one trace as dicts, for progress and diagnosis of a live or finished run: a
        line still being written (or torn by a kill) is left out; no trace file, no records.  Not for
        checking: the trace checker parses strictly (:func:`accelpact.impl.trace.parse_trace`)."""
        p = self.trace(attempt, rank)
        if not p.exists():
            return []
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def fault_time_ns(self, attempt: int, gen: int | None = None) -> int | None:
        """Earliest injected-fault record (``Fault*``) of ``attempt`` (of generation ``gen`` if given)."""
        times = [rec["t_ns"] for (a, r) in self.trace_files() if a == attempt for rec in self.records(a, r)
                 if rec.get("type") == "action" and str(rec.get("action", "")).startswith("Fault")
                 and (gen is None or rec.get("gen") == gen)]
        return min(times, default=None)

    # ---- cleaning -----------------------------------------------------------------------------
    def clear(self) -> None:
        """Remove what a previous run left (results, traces, snapshots, checkpoints, logs).

        Why: the worker resumes from the latest committed checkpoint it finds; a stale ``ckpt/``
        from an earlier run would make a fresh job start at that run's end, and a stale spare's
        trace would be read as an incarnation of this run (a soak's judge rejected a run for one left
        by the previous soak in the same folder).  Only files this package writes are removed."""
        if not self.path.is_dir():
            return
        for p in self.path.iterdir():
            n = p.name
            if (any(f.match(n) for f in (_TRACE, _SPARE_TRACE, _RESULT, _SPARE_RESULT, _STEPS, _MEMORY))
                    or n in ("job.json", "DONE", "torchrun.log", "report-timeline.png")
                    or re.match(r"^(final-r\d+\.pt|local-a\d+\.log|\.final-r\d+\.pt\.tmp|(spare\d+-)?result-a\d+(-r\d+)?\.json\..*\.tmp)$", n)):
                p.unlink(missing_ok=True)
        shutil.rmtree(self.ckpt, ignore_errors=True)
