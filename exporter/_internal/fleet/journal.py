"""The aggregator's restart safety on disk: a snapshot file and a journal of pushes since it.

Every push is appended to the journal (`<snapshot_path>.journal`) before the aggregator
acknowledges it; a write that does not complete raises, and the push is then not acknowledged
(its worker keeps and resends it). With `durability: machine` the journal is also fsync'd before
the answer (`sync`). The whole state is written atomically (temporary file, fsync, rename, fsync
of the directory) every `snapshot_interval_seconds` and at shutdown, after which the journal is
emptied.

A record is a magic, the body's length and the CRC-32 of both, then the push body as received:
at start the snapshot is read and the journal replayed, and a record that does not check (a
zeroed length, a flipped byte, a write cut by a crash) is skipped: the replay finds the next
magic and goes on, so one bad record loses itself, not the records after it. Bad records are
counted (`skipped`); the bytes after the last good record (a write cut by a crash) are cut off
the file, so later records are never appended behind garbage. A journal of the first format
(a length and a body, no magic: a journal in which no record checks) is still replayed, up to
its first bad record; the aggregator then snapshots at once, which empties it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator

log = logging.getLogger("exporter.aggregator")
#: fdatasync where the system has it (Linux): the data and the size, not the times.
_datasync = getattr(os, "fdatasync", os.fsync)


def unusable(path: str) -> str | None:
    """Why a snapshot cannot be kept at `path` (None when it can): its directory must exist and
    take new files (tried: a permission check would pass for root on a read-only volume), and
    the snapshot and journal, if there, must open for reading and writing."""
    folder = Path(path).parent
    if not folder.is_dir():
        return f"the directory {folder} does not exist"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
        for file in (Path(path), Path(path + ".journal")):
            if file.exists():
                with open(file, "r+b"):
                    pass
    except OSError as e:
        return f"cannot use {e.filename or folder}: {e.strerror or e}"
    return None

#: A record: MAGIC, the body's length, the CRC-32 of the length's 4 bytes and the body, the body.
MAGIC = b"\xd7TJ2"
_HEADER = struct.Struct(">4sII")
_LENGTH = struct.Struct(">I")  # the first format: a length, then the body


class StateFiles:
    """The snapshot at `path` and its journal at `path + ".journal"`."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.journal_path = Path(path + ".journal")
        self._journal: int | None = None
        self.skipped = 0  # bad records found by the last replay
        self.old_format = False  # the last replay read a journal of the first format

    # --- start --------------------------------------------------------------------------------

    def read_snapshot(self) -> dict[str, Any] | None:
        """The snapshot document, or None (no file, or unreadable: moved aside and logged)."""
        if not self.path.exists():
            return None
        try:
            doc = json.loads(zlib.decompress(self.path.read_bytes()))
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            return doc
        except (OSError, ValueError, zlib.error) as e:
            self.set_aside(str(e))
            return None

    def set_aside(self, why: str) -> None:
        """The snapshot cannot be used: keep it for inspection and start from zero."""
        aside = self.path.with_name(self.path.name + ".unreadable")
        log.warning("ttft-exporter aggregator: snapshot %s not restored (%s); moved to %s, "
                    "starting from zero", self.path, why, aside)
        with contextlib.suppress(OSError):
            os.replace(self.path, aside)

    def replay(self) -> Iterator[bytes]:
        """The journal's good records, in order; then the journal is open for appends, cut
        after the last good record. `skipped` counts the bad ones (not a cut-off tail)."""
        data = b""
        with contextlib.suppress(FileNotFoundError):
            data = self.journal_path.read_bytes()
        self.skipped = 0
        # a journal of the first format has no record that checks (a body would have to hold
        # a MAGIC, a length and their CRC by chance)
        self.old_format = bool(data) and all(body is None for body, _, _ in _records(data))
        records = _first_format(data) if self.old_format else _records(data)
        end = 0
        for body, end, skipped in records:
            self.skipped += skipped
            if body is not None:
                yield body
        self._journal = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT, 0o600)
        if end < len(data):
            log.warning("ttft-exporter aggregator: %d bytes after the last good journal record "
                        "cut off %s", len(data) - end, self.journal_path)
        os.ftruncate(self._journal, end)
        os.lseek(self._journal, end, os.SEEK_SET)
        _fsync_dir(self.journal_path.parent)  # the journal's name survives a power loss

    # --- while serving ------------------------------------------------------------------------

    def append(self, body: bytes) -> None:
        """Journal one push body; OSError when it could not be written whole (then nothing of
        it stays in the journal)."""
        if self._journal is None:
            raise OSError("the journal is not open")
        length = _LENGTH.pack(len(body))
        record = _HEADER.pack(MAGIC, len(body), zlib.crc32(body, zlib.crc32(length))) + body
        start = os.lseek(self._journal, 0, os.SEEK_CUR)
        try:
            view = memoryview(record)
            while view:
                written = os.write(self._journal, view)
                if written <= 0:
                    raise OSError("the journal write made no progress")
                view = view[written:]
        except OSError:
            with contextlib.suppress(OSError):  # leave no partial record behind
                os.ftruncate(self._journal, start)
                os.lseek(self._journal, start, os.SEEK_SET)
            raise

    def sync(self) -> None:
        """Make what was appended so far survive a power loss (fdatasync); OSError if not."""
        if self._journal is None:
            raise OSError("the journal is not open")
        _datasync(self._journal)

    def write_snapshot(self, doc: dict[str, Any], keep: Iterable[bytes] = (),
                       durable: bool = False) -> None:
        """Replace the snapshot atomically, then empty the journal but for `keep` (pushes
        journalled and not yet applied, so not in `doc`), fsync'd when `durable`; OSError on
        failure."""
        tmp = None
        try:
            data = zlib.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8"), 6)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp",
                                       dir=str(self.path.parent))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            tmp = None
            _fsync_dir(self.path.parent)
            if self._journal is not None:
                os.ftruncate(self._journal, 0)
                os.lseek(self._journal, 0, os.SEEK_SET)
                for body in keep:
                    self.append(body)
                if durable:
                    self.sync()
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    @property
    def is_open(self) -> bool:
        return self._journal is not None

    def close(self) -> None:
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None


class GroupSync:
    """`durability: machine` on the event loop: each push waits for an fsync of the journal
    that began after its record was written. Pushes written while one fsync runs share the
    next, so a busy aggregator makes far fewer fsyncs than pushes; its own thread does them,
    while the aggregator's thread goes on writing and applying."""

    def __init__(self, files: StateFiles):
        self.files = files
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttft-journal-sync")
        self._waiting: asyncio.Future[None] | None = None  # the group of the next fsync
        self._running = False
        self.syncs = 0  # fsyncs made (bench, tests)

    async def wait(self) -> None:
        """Return once what was written before this call is on disk; OSError when the fsync
        failed."""
        loop = asyncio.get_running_loop()
        if self._waiting is None:
            self._waiting = loop.create_future()
        group = self._waiting
        if not self._running:
            self._running = True
            loop.create_task(self._run())
        await asyncio.shield(group)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting is not None:
                group, self._waiting = self._waiting, None
                try:
                    await loop.run_in_executor(self.thread, self.files.sync)
                    self.syncs += 1
                except OSError as e:
                    group.set_exception(e)
                else:
                    group.set_result(None)
        finally:
            self._running = False


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(str(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _records(data: bytes) -> Iterator[tuple[bytes | None, int, int]]:
    """(body or None, end of the last good record, bad records passed) as the journal is read:
    a record that does not check is passed by looking for the next MAGIC."""
    pos = good_end = 0
    while pos < len(data):
        if data.startswith(MAGIC, pos) and pos + _HEADER.size <= len(data):
            _, length, crc = _HEADER.unpack_from(data, pos)
            start = pos + _HEADER.size
            end = start + length
            body = data[start:end]
            if end <= len(data) and zlib.crc32(body, zlib.crc32(_LENGTH.pack(length))) == crc:
                pos = good_end = end
                yield body, good_end, 0
                continue
        following = data.find(MAGIC, pos + 1)
        if following < 0:  # the last record was cut by a crash: never acknowledged
            return
        pos = following
        yield None, good_end, 1  # a bad record with good ones after it: lost, counted


def _first_format(data: bytes) -> Iterator[tuple[bytes | None, int, int]]:
    """The records of a journal of the first format (length, body), up to a cut one."""
    pos = 0
    while pos + _LENGTH.size <= len(data):
        (size,) = _LENGTH.unpack_from(data, pos)
        end = pos + _LENGTH.size + size
        if end > len(data):
            return
        yield data[pos + _LENGTH.size:end], end, 0
        pos = end
