"""Test doubles for a gloo op that a revoke did not wake (bench/README.md, K6).

A rank's op on a group whose sockets were shut down can stay blocked until the group's own timeout;
an end-to-end run meets that race only sometimes, so the engine's bounded waits (the commit fence's,
the failure flag's: ``Pact._wait_unless_revoked``) are tested against these doubles, which
``backends.backend_of`` reads as gloo (no ``_get_backend``): :class:`HungWork` never completes until
the test releases it, :class:`HungGroup` hands it out for every all-reduce.
"""

from __future__ import annotations

import threading

__all__ = ["HungGroup", "HungWork"]


class HungWork:
    """A gloo work that never completes until :attr:`released` is set; then it fails as an op on a
    cut pair does.  A timed ``wait`` raises gloo's "Operation timed out!" once its slice passes; an
    unbounded one gives up after 30 s with an error naming it (the test's defect, not a hang)."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def wait(self, timeout=None) -> bool:
        if timeout is None:
            if not self.released.wait(30.0):
                raise RuntimeError("test: an unbounded wait on a hung op")
            raise RuntimeError("Connection closed by peer (test: released)")
        if self.released.wait(timeout.total_seconds()):
            raise RuntimeError("Connection closed by peer (test: released)")
        raise RuntimeError("Operation timed out!")

    def is_completed(self) -> bool:
        return self.released.is_set()


class HungGroup:
    """A group of ``size`` ranks, seen from ``rank``, whose all-reduce is :attr:`work` (hung)."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank
        self.work = HungWork()

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def allreduce(self, tensors, opts=None) -> HungWork:
        return self.work
