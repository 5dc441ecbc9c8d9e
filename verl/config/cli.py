"""The command line of the Hydra entry points (``main_ppo``, recipes), before Hydra sees it.

* ``+key=value`` for a key the schema has becomes ``key=value`` (verl scripts add keys with ``+``
  that verl's YAML lacks; see :func:`verl.config.compat.normalize_overrides`).
* ``--cfg job`` (print the config and exit) would skip validation inside Hydra; here the config is
  composed and validated first, so a bad value fails the same way with and without ``--cfg``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from verl.config.base import ConfigError
from verl.config.compat import normalize_overrides
from verl.config.ppo_trainer import PPOTrainerConfig, load_config


def prepare_argv(
    argv: list[str],
    config_name: str,
    config_dir: str,
    entry_check: Callable[[PPOTrainerConfig], None] | None = None,
) -> list[str]:
    """The arguments to hand to ``@hydra.main``; with ``--cfg`` the config is validated first (a
    ConfigError is printed and exits with status 1)."""
    from hydra._internal.utils import get_args_parser

    argv = normalize_overrides(list(argv), PPOTrainerConfig)
    args, _ = get_args_parser().parse_known_args(argv)
    if args.cfg is None:
        return argv
    if args.config_path:
        config_dir = os.path.abspath(os.path.expanduser(args.config_path))
    try:
        config = load_config(
            args.overrides, config_name=args.config_name or config_name, config_dir=config_dir
        )
        if entry_check is not None:
            entry_check(config)
    except ConfigError as error:
        print(f"Error in the config: {error}", file=sys.stderr)
        sys.exit(1)
    return argv
