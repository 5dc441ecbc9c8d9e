"""``python -m verl.trainer.main_ppo ARGS`` inside the test process: the calls of its ``__main__``
block, without the 5-10 s of imports each subprocess pays. The process itself (exit status, the
one line on stderr) is checked by one real subprocess per entry point in test_one_line_errors.py."""

from __future__ import annotations

import sys

import pytest
from hydra.core.global_hydra import GlobalHydra

from verl.config.cli import compose_config, prepare_argv
from verl.config.compat import refuse_recipe_only_keys
from verl.config.ppo_trainer import CONFIG_DIR
from verl.trainer import main_ppo


def checked_argv(*args: str) -> list[str]:
    """What the ``__main__`` block hands to Hydra (it exits with status 1 on a user's mistake)."""
    return prepare_argv(list(args), "ppo_trainer", CONFIG_DIR, entry_check=refuse_recipe_only_keys)


def run_job(*args: str) -> None:
    """The job Hydra starts for ``args``: ``main`` on the config Hydra composes from them."""
    main_ppo.main(compose_config(checked_argv(*args), "ppo_trainer", CONFIG_DIR))


def print_config(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    """``ARGS --cfg job``: the config checked, then printed by Hydra's own ``--cfg`` on stdout."""
    argv = checked_argv(*args, "--cfg", "job")
    monkeypatch.setattr(sys, "argv", ["main_ppo.py", *argv])
    try:
        main_ppo.main()
    finally:
        GlobalHydra.instance().clear()
