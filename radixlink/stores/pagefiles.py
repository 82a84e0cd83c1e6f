"""Page files of the directory store, opened as untrusted input: no symlink is followed, nothing
that is not a regular file is read, no file is read past a size limit, no open can block.

Owns single-file reads and atomic writes, store-root checks and temp-file names. Knows nothing
of keys, the index or capacity (directory.py).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote

# NOTE: O_NOFOLLOW refuses a symlink at the page name (ELOOP); O_NONBLOCK makes opening a FIFO
# return at once instead of waiting for a writer (fstat then refuses it).
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")
# NOTE: the one place under /dev that holds real files: the shared-memory tmpfs, a store in RAM
SHARED_MEMORY = "/dev/shm"
_CHUNK = 1 << 24
IOV_MAX = 1024  # NOTE: the most buffers one readv takes on Linux (sysconf SC_IOV_MAX)
PART_BYTES = 192 * 1024
"""A page read for a caller that checks it part by part (``part``) is read in runs of pieces
of about this many bytes: one run's source and destination stay in a core's L2 (1 MiB here)
until it is checked. Pages of a vLLM block's size (5.9 MB; measured as 60 pieces of 96 KiB,
the block itself is 30 per-layer runs of 192 KiB), read and checked on one core in a plain
process: 0.62x a raw read checked after the whole page, 0.81x in runs of 192 KiB (0.71x in
runs of 768 KiB); a SGLang page (737 KB in 60 pieces of 12 KiB): 0.67x -> 0.71x. Sealed
pages are not read in runs (``pageio.read_scattered``)."""


def _compiled_loop() -> Any | None:
    """The compiled page loop (``_pagefiles.c``) bound to the xxhash package's xxh3, or None
    where it was not built (an optional extension) or xxhash does not export xxh3."""
    try:
        import xxhash

        from radixlink.stores import _pagefiles  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _pagefiles if _pagefiles.bind(xxhash._xxhash.__file__) else None


COMPILED = _compiled_loop()
"""The compiled loop ``read_pages_xxh3`` runs, or None (then it returns None): a module
attribute so that tests can run the store without it."""


class NotAPage(OSError):
    """A file under a page name that the store refuses to read (symlink, FIFO, device, too
    large): a counted miss, never data."""


def read_page(path: str, max_bytes: int, touch_before: float | None) -> bytes:
    """The whole page file at ``path``.

    Args:
        path: the page file.
        max_bytes: files larger than this are refused from ``fstat`` alone (never read).
        touch_before: refresh the file's mtime (LRU order across processes) when it is older
            than this time; None never touches (read-only stores).

    Raises:
        FileNotFoundError: no page.
        NotAPage: a symlink, something other than a regular file, or a file over
            ``max_bytes``.
        OSError: any other read error.
    """
    fd, st = _open_page(path, max_bytes)
    try:
        data = os.read(fd, st.st_size)
        if len(data) < st.st_size:  # NOTE: one read suffices for regular files; loop if short
            parts = [data]
            left = st.st_size - len(data)
            while left > 0:
                part = os.read(fd, min(left, _CHUNK))
                if not part:
                    break
                parts.append(part)
                left -= len(part)
            data = b"".join(parts)
        _touch(fd, st, touch_before)
        return data
    finally:
        os.close(fd)


def read_pages_into(paths: Sequence[str | None], targets: Sequence[Sequence[memoryview]],
                    max_bytes: int, touch_before: float | None,
                    each: Callable[[int, int | None], None] | None = None,
                    part: Callable[[int, int], None] | None = None,
                    ) -> tuple[list[int | None], int, int]:
    """Read each page file into its pieces, in order (one ``readv``: a staging frame, or a
    header's staging and the pool rows of its payload), with ``read_page``'s rules for
    untrusted files; a None path is a miss. Of a file larger than its pieces (but within
    ``max_bytes``) only as many bytes as they hold are read, its size says so. A file that
    shrank under the read gives the bytes actually read (the codec sees a truncated page, a
    miss). ``each(i, size)``, given, runs once file ``i`` is read (and closed), before the
    next one is opened (``Store.get_scattered``). ``part(i, n)``, given, runs each time file
    ``i``'s first ``n`` pieces hold their bytes, the file read in runs of about
    ``PART_BYTES``; a run read short ends the calls for that file.

    Returns:
        Each file's size (None: no page, refused or unreadable), the number refused (a
        symlink, not a regular file, over ``max_bytes``) and the number of read errors.
    """
    # NOTE: one loop with no call per page besides the syscalls (open, fstat, readv, close),
    # the four a hardened read of one file takes: Python between them was a third of a
    # 64 KiB page's read time on tmpfs.
    sizes: list[int | None] = []
    refused = errors = 0
    open_, fstat, readv, close, is_reg = os.open, os.fstat, os.readv, os.close, stat.S_ISREG
    for i, (path, pieces) in enumerate(zip(paths, targets, strict=True)):
        if i and each is not None:  # NOTE: file i - 1 is read and closed (a continue below)
            each(i - 1, sizes[-1])
        if path is None:
            sizes.append(None)
            continue
        try:
            fd = open_(path, READ_FLAGS)
        except FileNotFoundError:
            sizes.append(None)
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # the page name is a symlink
                refused += 1
            else:
                errors += 1
            sizes.append(None)
            continue
        try:
            st = fstat(fd)
            size = st.st_size
            if not is_reg(st.st_mode) or size > max_bytes:
                refused += 1
                sizes.append(None)
                continue
            if part is not None and size and pieces:
                done = _read_in_runs(fd, i, pieces, part)
            else:
                done = readv(fd, pieces[:IOV_MAX]) if size and pieces else 0
            if done < size:  # NOTE: a file longer than its pieces, more pieces than one
                want = min(size, sum(piece.nbytes for piece in pieces))  # readv takes, or
                while done < want:  # a file that shrank under the read
                    got = readv(fd, _after(pieces, done))
                    if not got:
                        size = done
                        break
                    done += got
            if touch_before is not None and st.st_mtime < touch_before:
                _touch(fd, st, touch_before)
            sizes.append(size)
        except OSError:
            errors += 1
            sizes.append(None)
        finally:
            close(fd)
    if sizes and each is not None:
        each(len(sizes) - 1, sizes[-1])
    return sizes, refused, errors


def read_pages_xxh3(paths: Sequence[str | None], targets: Sequence[Sequence[memoryview]],
                    max_bytes: int, touch_before: float | None,
                    ) -> tuple[list[int | None], int, int, list[int | None]] | None:
    """``read_pages_into``'s reads, with its rules for untrusted files, in one call that lets
    the GIL go for the whole batch, each file read in runs of about ``PART_BYTES`` and the
    xxh3 of its pieces but the first and the last (a header's and a tag's: the payload) fed
    run by run while in cache. None where ``COMPILED`` is None: read with ``read_pages_into``.

    Returns:
        As ``read_pages_into``, and each file's xxh3 digest, None where it was not read
        whole into its pieces (missing, refused, short, or shrunk under the read).
    """
    if COMPILED is None:
        return None
    before = -1.0 if touch_before is None else touch_before
    sizes, refused, errors, digests = COMPILED.read_pages(paths, targets, max_bytes, before,
                                                          PART_BYTES, 1, 1)
    return sizes, refused, errors, digests


def _read_in_runs(fd: int, i: int, pieces: Sequence[memoryview],
                  part: Callable[[int, int], None]) -> int:
    """Read file ``i`` into ``pieces`` in runs of about ``PART_BYTES``, ``part(i, n)`` after
    each whole run; the bytes read (a short run ends it: the caller reads the rest)."""
    done = start = run = 0
    for end, piece in enumerate(pieces, 1):
        run += piece.nbytes
        if run < PART_BYTES and end < len(pieces) and end - start < IOV_MAX:
            continue
        got = os.readv(fd, pieces[start:end])
        done += got
        if got < run:
            return done
        part(i, end)
        start, run = end, 0
    return done


def _after(pieces: Sequence[memoryview], skip: int) -> list[memoryview]:
    """``pieces`` less their first ``skip`` bytes (at most ``IOV_MAX`` of them)."""
    for i, piece in enumerate(pieces):
        if skip < piece.nbytes:
            return [piece[skip:], *pieces[i + 1 : i + IOV_MAX]]
        skip -= piece.nbytes
    return []


def _open_page(path: str, max_bytes: int) -> tuple[int, os.stat_result]:
    """An fd of the regular file at ``path`` (no link followed, no blocking open) and its
    ``fstat``; NotAPage (the fd closed) for anything else or a file over ``max_bytes``."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the page name is a symlink
            raise NotAPage(exc.errno, "a symlink (never followed)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAPage(0, "not a regular file (a FIFO, device or directory)")
        if st.st_size > max_bytes:
            raise NotAPage(0, f"{st.st_size} bytes, over the limit of {max_bytes}")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _touch(fd: int, st: os.stat_result, touch_before: float | None) -> None:
    """Refresh the page's mtime (LRU order across processes) when older than
    ``touch_before``. NOTE: rarely, not per hit: an inode update per read halves read
    throughput. The fd is the page itself (opened without following links), never a link
    target."""
    if touch_before is not None and st.st_mtime < touch_before:
        try:
            os.utime(fd)
        except OSError:
            pass  # a read-only directory: the read still counts


def page_size_on_disk(path: str, max_bytes: int) -> int | None:
    """The size of the page file at ``path``, or None when there is no page there (missing,
    a symlink, not a regular file, or over ``max_bytes``). Follows no link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        return None
    return st.st_size


def write_page(path: str, tmp: str, view: memoryview) -> None:
    """Write ``view`` to ``tmp`` (created exclusively, never through a link) and rename it
    over ``path``: readers see the old page or the new one, never a part.

    Raises:
        OSError: the write failed; ``tmp`` is removed.
    """
    try:
        fd = os.open(tmp, WRITE_FLAGS, 0o644)
        try:
            while view:
                written = os.write(fd, view[:_CHUNK])
                view = view[written:]
        finally:
            os.close(fd)
        os.replace(tmp, path)  # NOTE: rename replaces a link at ``path``, never its target
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # never created, or the directory is unwritable; gc removes it later
        raise


def is_real_dir(path: str) -> bool:
    """Whether ``path`` is a directory and not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def check_root(root: str) -> str:
    """The absolute store root for ``root`` (``~`` expanded).

    Raises:
        ValueError: the path is the filesystem root, is under /proc, /sys or /dev (also
            through a link; a directory under /dev/shm, the shared-memory tmpfs, is
            allowed), or exists and is not a directory.
    """
    path = os.path.abspath(os.path.expanduser(root))
    if os.path.realpath(path) == "/":
        raise ValueError("store directory '/' is the filesystem root; a store needs a directory "
                         "of its own, e.g. file:///var/cache/radixlink/store")
    for candidate in (path, os.path.realpath(path)):
        if candidate.startswith(SHARED_MEMORY + "/"):
            continue  # a directory of its own on the shared-memory tmpfs
        if candidate == SHARED_MEMORY:
            raise ValueError(f"store directory {path!r} is /dev/shm itself; give the store a "
                             "directory of its own there, e.g. file:///dev/shm/radixlink")
        for forbidden in FORBIDDEN_ROOTS:
            if candidate == forbidden or candidate.startswith(forbidden + "/"):
                raise ValueError(
                    f"store directory {path!r} is under {forbidden}, which holds no real "
                    "files; use a directory such as ~/.cache/radixlink/store"
                )
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(
            f"store path {path!r} exists and is not a directory; choose another path"
        )
    return path


def root_of_url(rest: str) -> str:
    """The directory of a ``file://`` URL: ``file:///abs/path`` or ``file://~/in/home``."""
    if not rest:
        raise ValueError("file:// store URL names no directory; e.g. file:///var/cache/store")
    path = unquote(rest)
    if path.startswith(("/", "~")):
        return path
    host, _, local = path.partition("/")
    meant = local if host == "localhost" else path  # NOTE: else most likely a missing "/"
    raise ValueError(
        f"file:// store URLs take no host (got {host!r}); write file:///{meant} for an "
        "absolute path, or file://~/dir for one under your home"
    )


def subdirs(path: str, name_len: int) -> list[str]:
    """The real (not linked) subdirectories of ``path`` whose names are ``name_len`` long."""
    with os.scandir(path) as entries:
        return [
            e.path for e in entries if len(e.name) == name_len and e.is_dir(follow_symlinks=False)
        ]


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def writer_alive(name: str) -> bool:
    """Whether the pid in temp file ``name`` (``.<pid>.<random tag>.<seq>.tmp``) still runs."""
    pid_text = name[1:].split(".", 1)[0]
    if not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
