"""The cache folder (``$VERL_CACHE_DIR``, default ``~/.cache/verl``) and writing into it once.

Whatever a run creates on first use (the built-in task's parquet files and tiny models, the
SmolLM2 conversion) lives here. Writers go through :func:`write_task_once` and
:func:`build_model_once`, which build in a temporary folder and rename it into place, so an
interrupted first run leaves nothing half-written.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_DIR_EXPR = "${oc.env:VERL_CACHE_DIR,'~/.cache/verl'}"
"""The cache folder as an OmegaConf expression, for defaults written in the config."""


def cache_dir() -> Path:
    return Path(os.environ.get("VERL_CACHE_DIR", "~/.cache/verl")).expanduser()


def resolve_cache_path(path: str) -> Path:
    """``path`` with a leading :data:`CACHE_DIR_EXPR` replaced by :func:`cache_dir`."""
    if path.startswith(CACHE_DIR_EXPR):
        return cache_dir() / path[len(CACHE_DIR_EXPR) :].lstrip("/")
    return Path(path).expanduser()


def write_task_once(data_dir: Path, paths: tuple[str, ...], write: Callable[[str], None], what: str) -> None:
    """``write(folder)`` when one of ``paths`` is a missing file of ``data_dir``."""
    data_dir = data_dir.resolve()
    wanted = [Path(p).expanduser().resolve() for p in paths]
    if any(p.parent == data_dir and not p.exists() for p in wanted):
        logger.info("writing %s to %s", what, data_dir)
        write(str(data_dir))


def build_model_once(target: Path, path: str, build: Callable[[Path], None], what: str) -> None:
    """``build(folder)`` into a temporary folder, renamed to ``target`` (never half-written), when
    ``path`` is ``target`` and it holds no model yet; a model another process finished first wins."""
    if Path(path).expanduser().resolve() != target.resolve() or (target / "config.json").exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("building %s in %s (one-time SFT warm-up)", what, target)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-model-"))
    try:
        build(tmp)
        if target.exists():  # another process finished first
            shutil.rmtree(tmp)
            return
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
