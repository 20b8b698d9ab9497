"""Write-temp-then-rename, the one way this package publishes a file or a directory.

A reader (the dashboard, another node sharing ~/.cache/ftis-edge) sees the old version or the
new one, never half of one; after a SIGKILL only a hidden ``.NAME.*.tmp`` is left behind.
The temporary sits beside the target (same file system, so the rename is atomic).

``build_once`` lets one process build an expensive cache entry (a GGUF converted to PyTorch
takes a minute or more) while the others that need it at the same moment wait for it
(``one_builder``, its lock), instead of every node of a first start converting the same file
side by side.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:         # Windows (the README sends users to WSL2): no lock, every process builds
    fcntl = None

log = logging.getLogger(__name__)


def _fsync(path: Path) -> None:
    if os.name == "nt" and path.is_dir():
        return            # Windows cannot open a directory to fsync it (nor needs to)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str | os.PathLike, write: Callable[[Path], object], *, durable: bool = False) -> Path:
    """``write(tmp)`` writes a temporary file, which then replaces ``path``.

    durable: fsync the file and its directory (a checkpoint must survive a power cut)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync(path.parent)
    return path


def write_bytes(path: str | os.PathLike, data: bytes, *, durable: bool = False) -> Path:
    return write_file(path, lambda tmp: tmp.write_bytes(data), durable=durable)


def write_text(path: str | os.PathLike, text: str, *, durable: bool = False) -> Path:
    return write_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), durable=durable)


def write_dir(path: str | os.PathLike, write: Callable[[Path], object], *, keep_existing: bool = False,
              durable: bool = False) -> Path:
    """``write(tmp)`` fills a fresh temporary directory, which then becomes ``path``.

    keep_existing: when ``path`` already exists (another process won the race to build the same
    cache entry) theirs is kept and ours discarded; otherwise ``path`` is replaced.
    durable: fsync every file, then the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        write(tmp)
        if durable:
            for f in tmp.rglob("*"):
                if f.is_file():
                    _fsync(f)
        if path.exists() and not keep_existing:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        try:
            os.replace(tmp, path)        # onto an empty directory it succeeds, onto a full one it fails
        except OSError:
            if keep_existing and path.is_dir() and any(path.iterdir()):
                shutil.rmtree(tmp, ignore_errors=True)
                return path
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if durable:
        _fsync(path.parent)
    return path


def is_regular(path: str | os.PathLike) -> bool:
    """A regular file (through symlinks)? Files from a shared run directory are opened only
    then: a FIFO blocks its reader for ever, a device never ends."""
    import stat
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def sha256_of(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks (what a published file is checked against)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


@contextmanager
def one_builder(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Hold the build lock of cache entry ``path`` (a hidden ``.NAME.lock`` beside it).

    The lock dies with its process, so a builder killed mid-way frees the waiters (who then
    build it themselves). ``build_once`` is the way to use it."""
    path = Path(path)
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is building %s; waiting for it", what or path.name)
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def build_once(path: str | os.PathLike, built: Callable[[], bool], build: Callable[[], object],
               what: str = "") -> None:
    """Make sure cache entry ``path`` exists: ``build()`` it unless ``built()`` says it is there.

    ``built`` is asked before taking the lock (the fast path) and again holding it, so a process
    that waited finds the entry made by the one that held the lock and does not build it again."""
    if built():
        return
    with one_builder(path, what):
        if not built():
            build()
