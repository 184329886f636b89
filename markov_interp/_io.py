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

Reading is bounded the same way: `read_regular` is the one way the package reads a file it did not just write
(specs, configs, records, metrics, status and cache entries, clamp and weights files). It opens the path without
blocking, refuses anything but a regular file (a FIFO would hang, `/dev/zero` never ends) and a file larger than
the cap its kind is given in `READ_LIMITS`, before reading a byte of it. `loads_json` is the one JSON parser of
such text: nesting deeper than `MAX_JSON_DEPTH` is a ValueError naming the file, never a RecursionError.
"""

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["UnsafePath", "atomic_path", "atomic_write", "check_target", "describe_kind", "naming_error", "write_all",
           "csv_cell", "csv_uncell", "FileTooLarge", "READ_LIMITS", "MAX_JSON_DEPTH", "read_regular", "read_text",
           "loads_json", "check_depth", "read_json", "size_text"]


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


# ------------------------------------------------------------------------------------------------ reading
class FileTooLarge(ValueError):
    """A file is larger than its kind may be (`READ_LIMITS`); refused before any of it is read."""


_MiB = 2**20
# The most bytes the package reads of each kind of file (docs/faults.md lists them). Each is far above what the
# package writes (a sweep record ~10 KiB, a run's config.json ~2 KiB, a 40,000-step run's metrics.jsonl ~2 MiB,
# a reference-cache entry of T = 1024 ~200 KiB), so only a file that is not one of ours is refused.
READ_LIMITS = {
    "sweep spec": 4 * _MiB,
    "run config": 16 * _MiB,
    "sweep record": 64 * _MiB,
    "metrics file": 1024 * _MiB,
    "status file": _MiB,
    "reference-cache entry": 64 * _MiB,
    "clamp file": 1024 * _MiB,
    "results table": 1024 * _MiB,
    "results file": 256 * _MiB,
}
MAX_JSON_DEPTH = 64  # nesting of JSON the package reads (its own files nest at most ~8 deep)


def size_text(n: "int | float") -> str:
    """`n` bytes in binary units ("1.5 GiB"); `models.memory.human_bytes` is this."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def read_regular(path: "str | os.PathLike", what: str, *, limit: "int | None" = None) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (default `READ_LIMITS[what]`).

    The file is opened without blocking (a FIFO cannot hang it) and checked before anything is read: a device
    (`/dev/zero` never ends), FIFO, socket or folder is refused, and so is a file larger than `limit` (also one
    that grows past it while being read). A symbolic link to a regular file is read (the user named it; inside
    run and sweep folders `runs.check_contents` refuses links first).

    Args:
        path: the file.
        what: its kind, a key of `READ_LIMITS` (and how errors name it).
        limit: the cap in bytes (default the kind's).

    Returns:
        The file's bytes.

    Raises:
        UnsafePath: not a regular file. FileTooLarge: larger than `limit`. OSError: it cannot be opened or read
            (FileNotFoundError, PermissionError, naming the file).

    >>> read_regular("/dev/zero", "sweep spec")
    Traceback (most recent call last):
    ...
    markov_interp._io.UnsafePath: sweep spec /dev/zero is a character device, not a regular file; give the path of a regular file
    """
    limit = READ_LIMITS[what] if limit is None else limit
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"{what} {path} is {describe_kind(info.st_mode)}, not a regular file; give the path of "
                             "a regular file")
        if info.st_size > limit:
            raise FileTooLarge(_too_large(path, what, info.st_size, limit))
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(limit + 1 - size, 16 * _MiB) or 1)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while being read
                raise FileTooLarge(_too_large(path, what, size, limit, growing=True))
    finally:
        os.close(fd)


def _too_large(path: "str | os.PathLike", what: str, size: int, limit: int, growing: bool = False) -> str:
    return (f"{what} {path} is {'more than ' if growing else ''}{size_text(size)}, more than the {size_text(limit)} "
            f"markov-interp reads of a {what}; refusing to read it (is it the file you meant?)")


def read_text(path: "str | os.PathLike", what: str, *, limit: "int | None" = None) -> str:
    """`read_regular` decoded as UTF-8 (a ValueError naming the file where it is not)."""
    data = read_regular(path, what, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None


def loads_json(text: "str | bytes", what: str) -> object:
    """`json.loads(text)` with a depth limit: JSON nested deeper than `MAX_JSON_DEPTH` (or too deep for the
    parser) is a ValueError naming `what`, never a RecursionError; invalid JSON is `json.JSONDecodeError` (a
    ValueError) as usual.

    >>> loads_json("[" * 100 + "]" * 100, "a record")
    Traceback (most recent call last):
    ...
    ValueError: a record is JSON nested more than 64 deep
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} is JSON nested more than {MAX_JSON_DEPTH} deep") from None
    return check_depth(value, what)


def check_depth(value: object, what: str) -> object:
    """`value` (parsed JSON or TOML: dicts and lists) if it nests at most `MAX_JSON_DEPTH` deep, else ValueError
    naming `what`. Walked level by level, without recursion."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{what} is JSON nested more than {MAX_JSON_DEPTH} deep")
        level = [child for item in level if isinstance(item, (dict, list))
                 for child in (item.values() if isinstance(item, dict) else item) if isinstance(child, (dict, list))]
    return value


def read_json(path: "str | os.PathLike", what: str, *, limit: "int | None" = None) -> object:
    """The JSON value of the file `path` (`read_text`, then `loads_json`); a file that is not JSON raises
    ValueError naming it."""
    text = read_text(path, what, limit=limit)
    try:
        return loads_json(text, f"{what} {path}")
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} {path} is not valid JSON: {err}") from None
