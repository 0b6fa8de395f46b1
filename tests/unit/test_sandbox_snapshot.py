"""The bounded work-dir snapshot (infra/sandbox/snapshot.py) on a plain directory: every limit is
checked with lstat before any file is read, sparse files count at their apparent size, and a tree
within the limits comes back whole."""

from __future__ import annotations

import io
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import threading
import tracemalloc

import pytest

from infra.sandbox.snapshot import OverLimit, StateLimits, bounded_tar, scan

SMALL = StateLimits(max_bytes=1 << 20, max_files=50, max_depth=4, links=False)


def members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_sparse_files_are_refused_by_apparent_size_before_any_read(tmp_path):
    for i in range(16):  # 1 GiB apparent, a few KiB on disk
        with open(tmp_path / f".s{i}", "wb") as f:
            f.truncate(63 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(OverLimit, match=r"'\.s0' brings the files to more than 1048576 bytes \(it is 66060288 bytes"):
            bounded_tar(str(tmp_path), SMALL)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # nothing of the files was read


def test_real_size_counts_when_it_is_the_larger(tmp_path):
    """Blocks kept past the end (fallocate --keep-size): 0 bytes apparent, 2 MiB of disk."""
    path = tmp_path / "kept"
    path.touch()
    if shutil.which("fallocate") is None or subprocess.run(["fallocate", "-n", "-l", "2M", str(path)]).returncode:
        pytest.skip("this filesystem cannot allocate blocks past a file's end")
    assert os.stat(path).st_size == 0
    with pytest.raises(OverLimit, match=r"'kept' brings the files .* \(it is 0 bytes, 2097152 on disk\)"):
        scan(str(tmp_path), SMALL)


def make(tmp_path, kind: str) -> None:
    if kind == "files":
        for i in range(51):
            (tmp_path / f"f{i}").write_text("x")
    elif kind == "empty dirs":
        for i in range(51):
            (tmp_path / f"d{i}").mkdir()
    elif kind == "depth":
        (tmp_path / "a/b/c/d/e").mkdir(parents=True)
    elif kind == "bytes":
        (tmp_path / "big").write_bytes(b"x" * ((1 << 20) + 1))
    elif kind == "bytes over several files":
        for i in range(3):
            (tmp_path / f"part{i}").write_bytes(b"x" * 400_000)
    elif kind == "symlink":
        (tmp_path / "link").symlink_to("/etc/passwd")
    elif kind == "dangling symlink":
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub/link").symlink_to("nowhere")
    elif kind == "hard link":
        (tmp_path / "one").write_text("x")
        os.link(tmp_path / "one", tmp_path / "two")
    elif kind == "fifo":
        os.mkfifo(tmp_path / "pipe")
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(tmp_path / "sock"))
        s.close()
    elif kind == "character device":
        try:
            os.mknod(tmp_path / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs CAP_MKNOD")


@pytest.mark.parametrize("kind, message", [
    ("files", "more than 50 files and directories"),
    ("empty dirs", "more than 50 files and directories"),
    ("depth", "'a/b/c/d/e' is nested deeper than 4 directories"),
    ("bytes", "'big' brings the files to more than 1048576 bytes"),
    ("bytes over several files", "'part2' brings the files to more than 1048576 bytes"),
    ("symlink", "'link' is a symlink"),
    ("dangling symlink", "'sub/link' is a symlink"),
    ("hard link", "'one' is a hard link"),
    ("fifo", "'pipe' is a fifo"),
    ("socket", "'sock' is a socket"),
    ("character device", "'null' is a character device"),
])
def test_every_limit_is_enforced_before_anything_is_opened(tmp_path, kind, message):
    make(tmp_path, kind)
    result: list[BaseException] = []
    # a fifo opened for reading would block: the refusal must come from lstat alone
    t = threading.Thread(target=lambda: result.append(pytest.raises(OverLimit, bounded_tar, str(tmp_path), SMALL).value))
    t.start()
    t.join(5)
    assert not t.is_alive(), "the snapshot blocked on an entry"
    assert result and message in str(result[0])


def test_the_limits_themselves_are_allowed(tmp_path):
    (tmp_path / "a/b/c/d").mkdir(parents=True)  # depth 4
    (tmp_path / "a/b/c/d/f").write_bytes(b"y" * (SMALL.max_bytes - 8192))
    for i in range(45 - 1):
        (tmp_path / f"small{i}").write_bytes(b"")  # empty: no blocks
    assert len(scan(str(tmp_path), SMALL)) == 49
    (tmp_path / "last").write_bytes(b"")
    assert len(scan(str(tmp_path), SMALL)) == 50


def test_a_tree_within_the_limits_comes_back_whole(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.txt").write_text("alpha 1\n")
    (tmp_path / "b.bin").write_bytes(bytes(range(256)))
    (tmp_path / ".hidden").write_text("h")
    got = members(bounded_tar(str(tmp_path), SMALL))
    assert list(got) == [".hidden", "b.bin", "docs", "docs/a.txt"]  # parents first, names sorted
    assert got["docs"].isdir() and got["docs/a.txt"].size == 8
    with tarfile.open(fileobj=io.BytesIO(bounded_tar(str(tmp_path), SMALL))) as tar:
        assert tar.extractfile("b.bin").read() == bytes(range(256))


def test_links_allowed_are_archived_as_links_and_their_data_counted_once(tmp_path):
    (tmp_path / "one").write_bytes(b"z" * 700_000)
    os.link(tmp_path / "one", tmp_path / "two")  # 1.4 MB by name, 0.7 MB of data
    (tmp_path / "link").symlink_to("one")
    got = members(bounded_tar(str(tmp_path), StateLimits(max_bytes=1 << 20, links=True)))
    assert got["one"].isfile() and got["two"].islnk() and got["link"].issym() and got["link"].linkname == "one"
    with pytest.raises(OverLimit, match="'fifo' is a fifo"):  # special files stay refused
        os.mkfifo(tmp_path / "fifo")
        bounded_tar(str(tmp_path), StateLimits(links=True))
