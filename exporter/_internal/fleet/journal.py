"""The aggregator's restart safety on disk: a snapshot file and a journal of pushes since it.

Every push is appended to the journal (`<snapshot_path>.journal`, records of a 4-byte big-endian
length and the push body as received) before the aggregator acknowledges it; a write that does
not complete raises, and the push is then not acknowledged (its worker keeps and resends it).
The whole state is written atomically (temporary file, fsync, rename, fsync of the directory)
every `snapshot_interval_seconds` and at shutdown, after which the journal is emptied. At start
the snapshot is read and the journal replayed; a record cut short by a crash ends the replay and
is cut off the file, so later records are never appended behind it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger("exporter.aggregator")


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

_RECORD = struct.Struct(">I")


class StateFiles:
    """The snapshot at `path` and its journal at `path + ".journal"`."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.journal_path = Path(path + ".journal")
        self._journal: int | None = None

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
        """The journal's complete records, in order; then the journal is open for appends,
        cut after the last complete record."""
        data = b""
        with contextlib.suppress(FileNotFoundError):
            data = self.journal_path.read_bytes()
        pos = 0
        while pos + _RECORD.size <= len(data):
            (size,) = _RECORD.unpack_from(data, pos)
            end = pos + _RECORD.size + size
            if end > len(data):
                break  # a record cut by a crash: it was never acknowledged
            yield data[pos + _RECORD.size:end]
            pos = end
        self._journal = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT, 0o600)
        if pos < len(data):
            log.warning("ttft-exporter aggregator: %d bytes of an incomplete journal record cut "
                        "off %s", len(data) - pos, self.journal_path)
        os.ftruncate(self._journal, pos)
        os.lseek(self._journal, pos, os.SEEK_SET)

    # --- while serving ------------------------------------------------------------------------

    def append(self, body: bytes) -> None:
        """Journal one push body; OSError when it could not be written whole (then nothing of
        it stays in the journal)."""
        if self._journal is None:
            raise OSError("the journal is not open")
        record = _RECORD.pack(len(body)) + body
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

    def write_snapshot(self, doc: dict[str, Any]) -> None:
        """Replace the snapshot atomically, then empty the journal; OSError on failure."""
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


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(str(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
