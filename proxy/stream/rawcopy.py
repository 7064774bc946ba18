"""The exact bytes a stream's client received, and when each write went: what playback needs.

A stream's copy is held in memory until its record is written, so it must not cost a byte per
byte. Past `PLAIN_LIMIT` bytes, `RawCopy` compresses what comes as it comes (gzip level 1, a
small window, the smallest memory level): chunk JSON repeats within a chunk or two, so a small
window finds almost all of it while the compressor's own state stays small. Shorter streams
keep their bytes as they are (the compressor would cost more) and are compressed whole, with
the full window, when the record is completed. The memory held is measured in
docs/performance.md.
"""

from __future__ import annotations

import zlib
from array import array

PLAIN_LIMIT = 12 * 1024
"""Bytes kept as they are before the copy is compressed as it grows: past about this, the
compressor's state and its output cost less than the bytes."""
_WINDOW_BITS = 10
_MEM_LEVEL = 1
_MIN_BITS, _MAX_BITS = 9, zlib.MAX_WBITS
_LOOKAHEAD = 262
"""zlib's MIN_LOOKAHEAD: the farthest a match reaches back is the window less this."""


def compress_whole(data: bytes | bytearray) -> bytes:
    """A stream's bytes as one gzip member, compressed at once. Level 1: chunk JSON still
    shrinks ~24:1 (31:1 at level 6) at less than half the CPU.

    The window is the smallest that reaches back over all of `data` (deflate matches reach
    `2**bits - 262` bytes back), so the bytes are those of `gzip.compress(data, 1, mtime=0)`,
    and a short stream's compressor does not set up (and touch) a 32 KiB window and its
    ~256 KiB of state per stream."""
    bits = _MIN_BITS
    while bits < _MAX_BITS and (1 << bits) - _LOOKAHEAD < len(data):
        bits += 1
    return zlib.compress(data, 1, 16 + bits)


class RawCopy:
    def __init__(self) -> None:
        self.size = 0
        self._plain = bytearray()
        self._compressor: zlib._Compress | None = None
        self._gzip = bytearray()
        self._ends = array("q")
        """Stream offset after each write."""
        self._times = array("d")
        """Milliseconds since the request arrived, at each write."""
        self._ended: bytes | None = None

    def add(self, data: bytes, ms: float) -> None:
        """`data` was written to the client `ms` after the request arrived."""
        if self._ended is not None:
            raise RuntimeError("the copy has ended: gzip() was called")
        self.size += len(data)
        self._ends.append(self.size)
        self._times.append(ms)
        if self._compressor is not None:
            self._gzip += self._compressor.compress(data)
            return
        self._plain += data
        if len(self._plain) > PLAIN_LIMIT:
            self._compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + _WINDOW_BITS, _MEM_LEVEL)
            self._gzip += self._compressor.compress(self._plain)
            self._plain = bytearray()

    def gzip(self) -> bytes:
        """All the bytes, as one gzip member. Ends the copy; later calls give the same."""
        if self._ended is None:
            if self._compressor is None:
                self._ended = compress_whole(self._plain)
            else:
                self._gzip += self._compressor.flush()
                self._ended = bytes(self._gzip)
            self._plain = self._gzip = bytearray()
            self._compressor = None
        return self._ended

    def pacing(self) -> list[tuple[int, float]]:
        """(offset after the write, ms since the request arrived) for each write."""
        return list(zip(self._ends, self._times, strict=True))
