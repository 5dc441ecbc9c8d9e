"""The command line of the Hydra entry points (``main_ppo``, the SFT and RM trainers, recipes).

* ``+key=value`` for a key the schema has becomes ``key=value`` (verl scripts add keys with ``+``
  that verl's YAML lacks; see :func:`verl.config.compat.normalize_overrides`).
* A mistake the user can fix (a value out of range, an unknown key, a missing data file or model
  directory: a :class:`~verl.utils.errors.UserInputError`, or Hydra's and OmegaConf's errors about
  the config) is printed as one line on stderr, ``Error in the config: <key>: expected ..., got ...``
  (``Error in the data:``, ``Error in the model:``), and the process exits with status 1:
  :func:`user_errors_as_one_line` around the job, and :func:`check_argv`, which composes the config
  once before Hydra starts, so that the overrides Hydra itself refuses are reported the same way.
  ``HYDRA_FULL_ERROR=1`` shows the traceback instead. Errors raised inside Ray workers keep theirs.
* ``--cfg job`` (print the config and exit) would skip validation inside Hydra; here the config is
  composed and validated first, so a bad value fails the same way with and without ``--cfg``. What
  this project cannot run (a feature, a device) is refused when the run starts, not by ``--cfg job``,
  which prints the config a machine with that hardware would run (:mod:`verl.config.start_up`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hydra.errors import HydraException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from verl.config.compat import normalize_overrides
from verl.config.hydra_schema import compose_on_schema
from verl.config.ppo_trainer import PPOTrainerConfig, load_config
from verl.config.presets import with_preset
from verl.utils.errors import UserInputError

CONFIG_ERRORS = (HydraException, OmegaConfBaseException)
"""Hydra's and OmegaConf's errors about the composed config (unknown key, wrong type, bad override)."""


def one_line(error: BaseException) -> str:
    """``error``'s message on one line, led by the full key where OmegaConf names one."""
    if isinstance(error, HydraException) and isinstance(error.__cause__, OmegaConfBaseException):
        error = error.__cause__  # Hydra's "Could not override 'key'" wraps OmegaConf's reason
    key = getattr(error, "full_key", None) if isinstance(error, OmegaConfBaseException) else None
    if key:
        if isinstance(error, ConfigAttributeError | ConfigKeyError):
            return f"{key}: unknown key; this project does not read it (--cfg job prints the keys it knows)"
        return f"{key}: {str(error.msg).splitlines()[0]}"
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return f"{error.override}: {text}" if isinstance(error, OverrideParseException) else text


def _raised_in_a_worker(error: BaseException) -> bool:
    ray_exceptions = sys.modules.get("ray.exceptions")
    return ray_exceptions is not None and isinstance(error, ray_exceptions.RayError)


@contextmanager
def user_errors_as_one_line() -> Iterator[None]:
    """Print a user's mistake raised inside as ``Error in the <kind>: <message>`` on stderr and exit
    with status 1 (for entry points only: the traceback says nothing the message does not).
    ``HYDRA_FULL_ERROR=1`` re-raises it, so that Hydra prints the full traceback."""
    try:
        yield
    except (UserInputError, *CONFIG_ERRORS) as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or _raised_in_a_worker(error):
            raise
        kind = error.kind if isinstance(error, UserInputError) else "config"
        print(f"Error in the {kind}: {one_line(error)}", file=sys.stderr, flush=True)
        sys.exit(1)


def check_argv(
    argv: list[str],
    config_name: str,
    config_dir: str,
    load: Callable[[list[str], str, str], Any],
    choose_preset: bool = False,
) -> list[str]:
    """``argv`` for ``@hydra.main``, after composing its config here once, so that an override Hydra
    would refuse is a one-line error too; with ``--cfg``, ``load(overrides, config_name, config_dir)``
    also validates it. ``choose_preset``: add the sizes preset :mod:`verl.config.presets` picks
    (PPO configs). Runs Hydra handles differently (``--multirun`` sweeps, ``--config-dir``
    search paths, ``--help``, ``--info``, ...) are left to Hydra."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(argv)
    if args.multirun or args.config_dir or args.help or args.hydra_help or args.info or args.shell_completion:
        return argv
    if args.config_path:  # relative to the entry point's module, as Hydra reads it under `python -m`
        path = os.path.expanduser(args.config_path)
        config_dir = os.path.abspath(os.path.join(os.path.dirname(config_dir), path))
    config_name = args.config_name or config_name
    with user_errors_as_one_line():
        composed = None
        if choose_preset:
            given = args.overrides
            args.overrides, composed = compose_on_schema(
                given, lambda o: compose_config(o, config_name, config_dir)
            )
            chosen = with_preset(args.overrides, composed)
            if chosen != args.overrides:
                args.overrides, composed = chosen, None
            argv = _add_overrides(argv, given, args.overrides[len(given) :])
        if args.cfg is None and composed is None:
            compose_config(args.overrides, config_name, config_dir)
        else:
            load(args.overrides, config_name, config_dir)
    return argv


def _add_overrides(argv: list[str], overrides: list[str], added: list[str]) -> list[str]:
    """``argv`` with ``added`` right after its last override (argparse takes the overrides as one run
    of positional arguments), or at its end when it has none."""
    if not added:
        return argv
    at = len(argv) - argv[::-1].index(overrides[-1]) if overrides else len(argv)
    return [*argv[:at], *added, *argv[at:]]


def compose_config(overrides: list[str], config_name: str, config_dir: str) -> Any:
    """The config Hydra would compose from ``overrides`` (not yet typed or validated)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def prepare_argv(
    argv: list[str],
    config_name: str,
    config_dir: str,
    entry_check: Callable[[PPOTrainerConfig], None] | None = None,
) -> list[str]:
    """The arguments of a PPO entry point (``main_ppo``, recipes) to hand to ``@hydra.main``
    (:func:`check_argv`; ``entry_check`` runs on the loaded config with ``--cfg``)."""

    def load(overrides: list[str], name: str, directory: str) -> None:
        # --cfg job prints what a machine with the hardware would run: no start-up refusals
        config = load_config(overrides, config_name=name, config_dir=directory, start_up=False)
        if entry_check is not None:
            entry_check(config)

    argv = normalize_overrides(list(argv), PPOTrainerConfig)
    return check_argv(argv, config_name, config_dir, load, choose_preset=True)
