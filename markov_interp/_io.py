"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file the package writes (weights, checkpoints, metrics, results tables, figures, reports) goes through
`atomic_path`: the writer fills a temporary file in the destination folder, which then replaces the target
with one `os.replace` (atomic on POSIX and Windows within a file system).

What it never does (see docs/faults.md): replace anything but a regular file. An existing symbolic link (to
anything, dangling included), FIFO, socket, device or folder at the target is refused with `UnsafePath`
before any byte is written, so a planted `RUN/metrics.jsonl -> ~/victim` or `report --out /dev/stdout` cannot
redirect or destroy what it points at. An OSError that carries no file name (a full disk raises ENOSPC from
`write` or `fsync` without one) is re-raised naming the file being written.

`csv_cell` / `csv_uncell` are the one rule for text cells of the CSV tables the package writes: a cell that a
spreadsheet would run as a formula is quoted.
"""

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["UnsafePath", "atomic_path", "atomic_write", "check_target", "describe_kind", "naming_error", "write_all",
           "csv_cell", "csv_uncell"]


class UnsafePath(ValueError):
    """A path the package will not write, replace or delete through: a symbolic link, FIFO, socket, device or
    folder where a regular file (or nothing) was expected. The message names the path and what is there."""


def describe_kind(mode: int) -> str:
    """What an `os.lstat` mode is, in words ("a FIFO", "a character device", ...)."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def check_target(path: "str | os.PathLike", what: str = "output") -> Path:
    """Check that `path` is absent or a regular file (not a link to one): what `atomic_path` may replace.

    Args:
        path: the file about to be written.
        what: how an error names the path ("--out", "metrics file", ...).

    Returns:
        `path` as a `Path`.

    Raises:
        UnsafePath: a symbolic link, folder, FIFO, socket or device is there (the message says which, and for
            a link where it points).
    """
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file in the way is the folder check's)
        return path
    if stat.S_ISREG(mode):
        return path
    if stat.S_ISLNK(mode):
        raise UnsafePath(f"{what} {path} is a symbolic link (to {os.readlink(path)}); markov-interp does not write "
                         "through links: remove the link or give the real path")
    raise UnsafePath(f"{what} {path} is {describe_kind(mode)}, not a regular file; refusing to replace it "
                     "(give the path of a regular file or a new one)")


@contextlib.contextmanager
def atomic_path(path: "str | os.PathLike") -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on error it is removed.

    Args:
        path: the file to (re)write; it must be absent or a regular file (`check_target`).

    Yields:
        The temporary file to fill (created empty, mode 0666 less the umask).

    Raises:
        UnsafePath: `path` is a link, folder, FIFO, socket or device (checked before and again just before
            the replace).
        OSError: a write failed; one that named no file (ENOSPC from `write` or `fsync`) names `path`.
    """
    path = check_target(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise naming_error(err, path) from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file an ordinary new file's mode
    try:
        yield Path(tmp)
        check_target(path)  # something may have appeared while the file was written
        os.replace(tmp, path)
    except OSError as err:
        _remove(tmp)
        raise naming_error(err, path) from err
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def naming_error(err: OSError, path: "str | os.PathLike") -> OSError:
    """`err` itself when it names a file, else the same error naming `path` (the file being written): ENOSPC
    from `write` or `fsync` carries no file name."""
    if err.filename is not None or err.errno is None:
        return err
    return type(err)(err.errno, err.strerror or os.strerror(err.errno), str(path))


def atomic_write(path: "str | os.PathLike", data: "bytes | str") -> Path:
    """Write `data` (bytes, or text as UTF-8) to `path` atomically and durably (fsync before the rename).

    Args:
        path: the file to write (see `atomic_path` for what is refused).
        data: the whole content.

    Returns:
        `path` as a `Path`.
    """
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_BINARY", 0))
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return Path(path)


def write_all(fd: int, data: "bytes | str") -> None:
    """Write all of `data` (bytes, or text as UTF-8) to the descriptor `fd` (`os.write` may write less than
    asked)."""
    payload = memoryview(data.encode("utf-8") if isinstance(data, str) else data)
    while payload:
        payload = payload[os.write(fd, payload):]


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")


def csv_cell(value: object) -> object:
    """A text cell made safe for spreadsheets: text starting with = + - @ (or tab, CR, or the quote itself) gets
    a leading ' so that it is read as text, not run as a formula; other values are returned unchanged.
    `csv_uncell` undoes it.

    >>> csv_cell("=HYPERLINK(1)"), csv_cell("-2"), csv_cell(-2), csv_cell("pq")
    ("'=HYPERLINK(1)", "'-2", -2, 'pq')
    """
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA_START) else value


def csv_uncell(text: str) -> str:
    """The text `csv_cell` quoted, back (a leading ' removed; numbers are never quoted)."""
    return text[1:] if text.startswith("'") else text
