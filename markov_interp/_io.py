"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file the package writes (weights, checkpoints, metrics, results tables, figures, reports) goes through
`atomic_path`: the writer fills a temporary file in the destination folder, which then replaces the target
with one `os.replace` (atomic on POSIX and Windows within a file system).
"""

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: "str | os.PathLike") -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file an ordinary new file's mode
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path: "str | os.PathLike", data: "bytes | str") -> Path:
    """Write `data` (bytes, or text as UTF-8) to `path` atomically and durably (fsync before the rename)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
    return Path(path)
