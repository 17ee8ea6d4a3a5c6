"""The run folder's names (impl/rundir.py): what ``RunDir.clear`` removes before a job reuses a folder.

A soak run twice into the same ``--out`` was judged RED for a file the first one left: a spare's trace
(``spare6-trace-a0-r0.ndjson``), read as an incarnation of rank 0 in the second run, after which
"only a process that died hands its identity on" failed.  ``clear`` removed ranks' traces and results
but not the spares'.  The expected names here are spelled out by the test, from the module's own list
of what a job writes, not taken from the code under test.
"""

from __future__ import annotations

from accelpact.impl.rundir import RunDir

WRITTEN = [  # every file a job writes into its folder (the module doc's list), one of each
    "job.json", "trace-a0-r0.ndjson", "spare6-trace-a0-r0.ndjson", "result-a1-r3.json", "spare7-result-a0.json",
    "steps-a0-r2.ndjson", "memory-a0-r1.ndjson", "final-r0.pt", "torchrun.log", "local-a2.log", "DONE",
    "report-timeline.png", ".final-r1.pt.tmp", "result-a0-r0.json.x1y2.tmp", "spare0-result-a1.json.x1y2.tmp",
]
FOREIGN = ["notes.txt", "trace-a0-r0.ndjson.bak", "spare-result.json", "ckpt-old"]


def test_clear_removes_every_file_a_job_writes_and_nothing_else(tmp_path):
    for n in WRITTEN + FOREIGN:
        (tmp_path / n).write_text("x")
    (tmp_path / "ckpt" / "step-3").mkdir(parents=True)
    RunDir(tmp_path).clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FOREIGN)


def test_result_names_tell_a_ranks_result_from_a_spares():
    assert RunDir.result_name("result-a2-r3.json") == ("rank", 2, 3)
    assert RunDir.result_name("spare5-result-a1.json") == ("spare", 1, 5)
    assert RunDir.result_name("spare5-result-a1.json.ab.tmp") is None
    assert RunDir.result_name("trace-a0-r0.ndjson") is None
    run = RunDir(".")
    assert RunDir.result_name(run.result(4, 1).name) == ("rank", 4, 1)
    assert RunDir.result_name(run.spare_result(2, 0).name) == ("spare", 0, 2)
