"""``exists`` / ``makedirs`` / ``copy`` that take a local path or an ``hdfs://`` one (verl's
``verl.utils.hdfs_io``).

Local paths go to ``os`` and ``shutil``. An ``hdfs://`` path goes to the Hadoop command-line client
(``hdfs dfs ...``); where that client is not on ``PATH`` the call fails with
:class:`HdfsUnavailableError`, naming the path, instead of silently doing nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["HDFS_PREFIX", "HdfsUnavailableError", "copy", "exists", "is_non_local", "makedirs"]

HDFS_PREFIX = "hdfs://"


class HdfsUnavailableError(FileNotFoundError):
    """An ``hdfs://`` path was given but the ``hdfs`` command-line client is not installed."""


def is_non_local(path: str) -> bool:
    """True for an ``hdfs://`` path."""
    return str(path).startswith(HDFS_PREFIX)


def _hdfs(*args: str, path: str) -> int:
    """Run ``hdfs dfs <args>``; its exit code."""
    client = shutil.which("hdfs")
    if client is None:
        raise HdfsUnavailableError(
            f"{path}: hdfs:// paths need the Hadoop `hdfs` command-line client on PATH, and it is not "
            "installed here; copy the files to a local directory and pass that path instead"
        )
    return subprocess.run([client, "dfs", *args], check=False).returncode


def exists(path: str, **kwargs) -> bool:
    """``os.path.exists`` for a local path; ``hdfs dfs -test -e`` for an ``hdfs://`` one."""
    if is_non_local(path):
        return _hdfs("-test", "-e", path, path=path) == 0
    return os.path.exists(path)


def makedirs(name: str, mode: int = 0o777, exist_ok: bool = False, **kwargs) -> None:
    """``os.makedirs`` for a local path; ``hdfs dfs -mkdir -p`` for an ``hdfs://`` one."""
    if not is_non_local(name):
        os.makedirs(name, mode=mode, exist_ok=exist_ok)
        return
    if _hdfs("-mkdir", "-p", name, path=name) != 0:
        raise OSError(f"hdfs dfs -mkdir -p {name} failed")


def copy(src: str, dst: str, **kwargs):
    """Copy a file (``shutil.copy``) or a directory tree (``shutil.copytree``) between local paths;
    with an ``hdfs://`` side, ``hdfs dfs -get`` / ``-put`` / ``-cp``. Returns the destination."""
    if not (is_non_local(src) or is_non_local(dst)):
        if os.path.isdir(src):
            return shutil.copytree(src, dst, **kwargs)
        return shutil.copy(src, dst, **kwargs)
    if is_non_local(src) and is_non_local(dst):
        args = ("-cp", "-f", src, dst)
    elif is_non_local(dst):
        args = ("-put", "-f", src, dst)
    else:
        args = ("-get", src, dst)
    if _hdfs(*args, path=src if is_non_local(src) else dst) != 0:
        raise OSError(f"hdfs dfs {' '.join(args)} failed")
    return dst
