"""A work dir as a tar archive, bounded before a byte of it is read (stdlib only).

A box's work dir is written by untrusted programs, and the host reads it back (an episode's end
state, a session snapshot). What a box holds is not what reading it costs: a sparse file of 63 MiB
takes 4 KiB of disk but 63 MiB of memory to read, thousands of files or a deep tree cost per entry,
and a fifo blocks whoever opens it. So ``scan`` walks the tree with ``lstat`` only (no file is
opened, no link followed) and refuses it, with the first limit it breaks, when it holds more files
or depth than allowed, a file type other than directory, regular file and (if allowed) symlink, or
more bytes than allowed, counting each regular file at the larger of its apparent size (what a read
returns) and its real size (the blocks it uses). Only then does ``bounded_tar`` open the files, each
with O_NOFOLLOW, and read exactly the size the scan saw, so the host's memory for a snapshot is
bounded by the limits whatever the box holds.

This module imports only the standard library: ``infra.sandbox.kubernetes`` ships its source into
sandbox pods ahead of the in-pod executor (``infra.k8s.sandbox_exec``), which enforces the same
limits there before anything crosses the API connection.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from dataclasses import dataclass


@dataclass(frozen=True)
class StateLimits:
    """What a snapshot of a work dir may hold; more is refused before anything is read.

    ``links``: symlinks and hard links are kept as links (no content is read for them); False
    refuses them, for a check that wants plain files only."""

    max_bytes: int = 64 << 20
    max_files: int = 10_000
    max_depth: int = 32
    links: bool = True


class OverLimit(Exception):
    """The work dir breaks a StateLimits limit (the message names the entry and the limit)."""


def _size(st: os.stat_result) -> int:
    """A regular file's cost: the larger of its apparent size and the disk it really uses."""
    return max(st.st_size, getattr(st, "st_blocks", 0) * 512)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a fifo"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def scan(root: str, limits: StateLimits) -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry under ``root``, parents first and names sorted;
    OverLimit at the first broken limit. Nothing is opened but directories."""
    entries: list[tuple[str, os.stat_result]] = []
    total = 0
    inodes: set[tuple[int, int]] = set()
    stack: list[tuple[str, int]] = [("", 0)]  # (directory relative to root, its depth)
    while stack:
        rel_dir, depth = stack.pop()
        found: list[tuple[str, os.stat_result]] = []
        with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
            for entry in it:
                rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
                if len(entries) + len(found) >= limits.max_files:
                    raise OverLimit(f"more than {limits.max_files} files and directories")
                found.append((rel, entry.stat(follow_symlinks=False)))
        found.sort()
        subdirs = []
        for rel, st in found:
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 > limits.max_depth:
                    raise OverLimit(f"{rel!r} is nested deeper than {limits.max_depth} directories")
                subdirs.append((rel, depth + 1))
            elif stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1 and not limits.links:
                    raise OverLimit(f"{rel!r} is a hard link ({st.st_nlink} names for one file)")
                if (st.st_dev, st.st_ino) not in inodes:  # a further name is archived as a link, no data
                    inodes.add((st.st_dev, st.st_ino))
                    total += _size(st)
                if total > limits.max_bytes:
                    raise OverLimit(f"{rel!r} brings the files to more than {limits.max_bytes} bytes "
                                    f"(it is {st.st_size} bytes, {st.st_blocks * 512} on disk)")
            elif not (stat.S_ISLNK(st.st_mode) and limits.links):
                raise OverLimit(f"{rel!r} is {_kind(st.st_mode)}")
            entries.append((rel, st))
        stack.extend(reversed(subdirs))  # parents first, then their contents in name order
    return entries


class _Exact(io.RawIOBase):
    """Reads exactly ``size`` bytes of an open file: the size the scan counted, whatever it holds now."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.left = fd, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = os.read(self.fd, n) if n else b""
        self.left -= len(data)
        return data


def bounded_tar(root: str, limits: StateLimits) -> bytes:
    """The work dir under ``root`` as an uncompressed tar (symlinks and hard links as links, never
    followed); OverLimit before any file is read when it breaks ``limits``."""
    entries = scan(root, limits)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, st in entries:
            path = os.path.join(root, rel)
            info = tar.gettarinfo(path, arcname=rel)
            if not info.isreg():
                tar.addfile(info)
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                now = os.fstat(fd)
                if (now.st_ino, now.st_size, now.st_mode) != (st.st_ino, st.st_size, st.st_mode):
                    raise OverLimit(f"{rel!r} changed while the work dir was read")
                info.size = st.st_size
                tar.addfile(info, _Exact(fd, st.st_size))
            finally:
                os.close(fd)
    return buf.getvalue()
