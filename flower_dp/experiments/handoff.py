"""Hand the caller's own Python objects to the Flower simulation it starts, through a private file.

``flwr run`` (:mod:`flower_dp.experiments.flower_run`) runs the ServerApp and the ClientApps in other processes.  A caller's own
model factory, data tensors or ClientApp cannot be named in a run configuration, so :func:`write` serialises them
(Ray's cloudpickle, which carries functions of the caller's script by value, as Ray itself would) into a new file,
mode 0600, in a folder of mode 0700 that the caller made for this run; its path goes into the run configuration.
:func:`read` loads such a file only after checking that it is the caller's: a regular file owned by this user,
neither it nor its folder readable or writable by anyone else.  So the file holds nothing but what the user's own
process wrote, for processes that user started; no message between a server and its clients and no checkpoint ever
carries a pickle (those go through :mod:`flower_dp.gossip.wire`).  The caller deletes the folder after the run.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["private_file", "read", "write"]


def private_file(path: str | Path, data: bytes) -> str:
    """Write ``data`` into the new file ``path`` (mode 0600) in a private folder (mode 0700); returns the path."""
    path = Path(path)
    _check_private(path.parent, stat.S_IFDIR)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return str(path)


def write(obj: Any, path: str | Path) -> str:
    """Serialise ``obj`` into the new file ``path`` (mode 0600) in a private folder (mode 0700); returns the path."""
    from ray import cloudpickle

    return private_file(path, cloudpickle.dumps(obj))


def read(path: str | Path) -> Any:
    """The object :func:`write` put in ``path``, after checking that the file and its folder are this user's alone."""
    from ray import cloudpickle

    path = Path(path)
    _check_private(path.parent, stat.S_IFDIR)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        _check_mode(path, os.fstat(f.fileno()), stat.S_IFREG)
        return cloudpickle.loads(f.read())


def _check_private(path: Path, kind: int) -> None:
    _check_mode(path, os.lstat(path), kind)


def _check_mode(path: Path, st: os.stat_result, kind: int) -> None:
    what = "folder" if kind == stat.S_IFDIR else "file"
    if stat.S_IFMT(st.st_mode) != kind:
        raise PermissionError(f"{str(path)!r} is not a {what}: a hand-off file must be a plain file in a plain folder")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{str(path)!r} belongs to uid {st.st_uid}, not to this user ({os.getuid()}): a "
                              "hand-off file is read only when this user wrote it")
    if st.st_mode & 0o077:
        raise PermissionError(f"{str(path)!r} has mode {stat.S_IMODE(st.st_mode):o}: others may read or change it; "
                              f"a hand-off {what} must be {'0700' if kind == stat.S_IFDIR else '0600'}")
