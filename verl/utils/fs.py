"""Paths that may be local or on HDFS (verl's ``verl.utils.fs``).

:func:`copy_to_local` is what verl's code calls on every model, data and checkpoint path: a local
path (or a hub id) comes back unchanged; an ``hdfs://`` path is copied once into a cache folder
(``<cache_dir>/<md5 of the path>/<its base name>``) through :mod:`verl.utils.hdfs_io`, which needs
the Hadoop client (see there). ``use_shm=True`` copies the result to ``/dev/shm`` as well, for
repeated fast loads.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile

from filelock import FileLock

from verl.utils.hdfs_io import copy, exists, is_non_local, makedirs

__all__ = ["copy", "copy_to_local", "exists", "get_local_temp_path", "is_non_local", "local_mkdir_safe"]
__all__ += ["makedirs", "md5_encode"]

logger = logging.getLogger(__name__)

SHM_CACHE = "/dev/shm/verl-cache"


def md5_encode(path: str) -> str:
    """The hex MD5 of ``path``: a cache folder name unique to it."""
    return hashlib.md5(path.encode()).hexdigest()


def get_local_temp_path(hdfs_path: str, cache_dir: str) -> str:
    """``<cache_dir>/<md5(hdfs_path)>/<basename(hdfs_path)>`` (its folder created)."""
    folder = os.path.join(cache_dir, md5_encode(hdfs_path))
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, os.path.basename(hdfs_path))


def copy_to_local(
    src: str,
    cache_dir: str | None = None,
    filelock: str = ".file.lock",
    verbose: bool = False,
    always_recopy: bool = False,
    use_shm: bool = False,
) -> str:
    """A local path holding ``src``: ``src`` itself when it is local (or a hub id), else a cached
    copy of the ``hdfs://`` path under ``cache_dir`` (the system temp folder by default), made once
    per path (again with ``always_recopy``). ``use_shm`` copies the result into ``/dev/shm``."""
    local = _fetch(src, cache_dir, verbose, always_recopy) if is_non_local(src) else src
    return _copy_to_shm(local) if use_shm else local


def _fetch(src: str, cache_dir: str | None, verbose: bool, always_recopy: bool) -> str:
    if src.endswith("/"):
        raise ValueError(
            f"copy_to_local: drop the trailing '/' of {src!r} (the copy is named by its base name)"
        )
    cache_dir = cache_dir or tempfile.gettempdir()
    os.makedirs(cache_dir, exist_ok=True)
    local = get_local_temp_path(src, cache_dir)
    # one lock per source path, so concurrent ranks copy it once
    with FileLock(os.path.join(cache_dir, md5_encode(src) + ".lock")):
        if always_recopy and os.path.exists(local):
            _remove(local)
        if not os.path.exists(local):
            if verbose:
                logger.info("copying %s to %s", src, local)
            copy(src, local)
    return local


def _copy_to_shm(src: str) -> str:
    """A copy of the local ``src`` under ``/dev/shm/verl-cache`` (reused when already there)."""
    absolute = os.path.abspath(os.path.normpath(src))
    dest = os.path.join(SHM_CACHE, md5_encode(absolute), os.path.basename(absolute))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if os.path.exists(dest):
        return dest
    if os.path.isdir(absolute):
        shutil.copytree(absolute, dest, dirs_exist_ok=True)
    else:
        shutil.copy2(absolute, dest)
    return dest


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.remove(path)


def local_mkdir_safe(path: str) -> str:
    """Create ``path`` (relative to the working directory) even when several processes race to;
    returns the absolute path."""
    path = os.path.abspath(path)
    os.makedirs(path, exist_ok=True)  # exist_ok makes the race harmless
    return path
