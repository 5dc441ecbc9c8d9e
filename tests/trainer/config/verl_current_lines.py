"""verl's current launch lines, as its scripts write them: extracted from a fetched copy of verl's
repository, committed as data (``verl_current_lines.json``) so that CI, which has no copy, checks
them too (tests/trainer/config/test_verl_current_lines.py).

Each script runs under bash with its ``python``/``python3`` replaced by a stub that records the
arguments of a call to one of :data:`ENTRIES` (and does nothing else); ``ray job submit ... --`` and
``srun ...`` run the command they wrap; downloads, ``pip``, ``conda``, ``nvidia-smi`` and Slurm's
``scontrol`` do nothing; ``date`` is 2026-01-01 00:00 UTC; the Slurm variables are those of a one-node, 8-GPU allocation (what the
scripts' ``#SBATCH`` headers ask for). ``$HOME`` and the checkout's folder are written as
:data:`HOME` and :data:`CHECKOUT`, so the record does not depend on this machine.

Re-record after fetching a newer verl (``VERL_REPO`` names its bare repository)::

    python -m tests.trainer.config.verl_current_lines record
    python -m tests.trainer.config.verl_current_lines count   # resolve each with --cfg job, per family
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.config.base import ConfigError
from verl.config.cli import prepare_argv
from verl.config.compat import refuse_recipe_only_keys
from verl.config.ppo_trainer import CONFIG_DIR
from verl.config.start_up import refuse_at_start_up
from verl.experimental.fully_async_policy import fully_async_main
from verl.experimental.one_step_off_policy import main_ppo as one_step_off_main
from verl.trainer import main_generation_server, main_ppo_sync

MIRROR = Path(os.environ.get("VERL_REPO", "/work/.mirror/volcengine+verl/repo"))
RECORD = Path(__file__).with_name("verl_current_lines.json")
HOME, CHECKOUT = "/home/user", "/verl"

# where verl keeps launch scripts (git pathspecs)
SOURCES = (
    "examples/*.sh",
    "verl/experimental/fully_async_policy/shell/*.sh",
    "verl/experimental/one_step_off_policy/shell/*.sh",
    "tests/special_e2e/generation/run_gen_qwen05_server.sh",
)
# verl's entry point -> the family its lines are counted in (main_ppo's are split by what they train)
ENTRIES = {
    "verl.trainer.main_ppo": "main_ppo",
    "verl.trainer.main_ppo_sync": "main_ppo_sync",
    "verl.experimental.fully_async_policy.fully_async_main": "fully_async",
    "verl.experimental.one_step_off_policy.main_ppo": "one_step_off",
    "verl.trainer.main_generation_server": "generation_server",
}
FAMILIES = ("fsdp", "megatron", "vlm", "fully_async", "one_step_off", "generation_server", "main_ppo_sync")

_PYTHON_STUB = """#!/bin/bash
if [ "$1" = "-m" ]; then
  case " $VERL_ENTRIES " in *" $2 "*)
    printf '%s\\0' "$@" > "$VERL_LINES_OUT/$(ls "$VERL_LINES_OUT" | wc -l)";;
  esac
fi
exit 0
"""
_RAY_STUB = """#!/bin/bash
[ "$1 $2" = "job submit" ] || exit 0
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift; exec "$@"
"""
_SRUN_STUB = """#!/bin/bash
while [ $# -gt 0 ]; do case "$1" in -w|-N|-n|-c|-p) shift 2;; -*) shift;; *) break;; esac; done
[ $# -gt 0 ] && exec "$@"
exit 0
"""
_DATE_STUB = """#!/bin/bash
PATH=/usr/bin:/bin TZ=UTC exec date -d @1767225600 "$@"
"""
_NOOP = ("conda", "hf", "huggingface-cli", "modelscope", "nvidia-smi", "npu-smi", "pip", "pip3", "scontrol")
_NOOP += ("sleep", "wget", "git", "torchrun")
# the environment of a one-node Slurm allocation with 8 GPUs, and variables scripts leave to the user
_ENV = {
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NNODES": "1",
    "SLURM_GPUS_PER_NODE": "8",
    "SLURM_CPUS_PER_TASK": "128",
    "SLURM_JOB_NODELIST": "node0",
    "HDFS_ROOT": f"{HOME}/hdfs",
    # the worker count and GPUs per worker of the cluster scheduler some of verl's scripts read
    "ARNOLD_WORKER_NUM": "1",
    "ARNOLD_WORKER_GPU": "8",
}


def script_paths(tree: Path) -> list[Path]:
    return sorted(
        p for pattern in SOURCES for p in tree.glob(pattern.replace("*.sh", "**/*.sh")) if p.is_file()
    )


def write_stubs(folder: Path) -> None:
    for name, text in {
        "python": _PYTHON_STUB,
        "python3": _PYTHON_STUB,
        "ray": _RAY_STUB,
        "srun": _SRUN_STUB,
        "date": _DATE_STUB,
    }.items():
        (folder / name).write_text(text)
    for name in _NOOP:
        (folder / name).write_text("#!/bin/bash\nexit 0\n")
    for path in folder.iterdir():
        path.chmod(0o755)


def calls(script: Path, tree: Path, stubs: Path, home: Path) -> list[list[str]]:
    """The argument lists ``script`` hands to :data:`ENTRIES`, in the order it calls them."""
    with tempfile.TemporaryDirectory() as out:
        env = {
            **_ENV,
            "PATH": f"{stubs}:/usr/bin:/bin",
            "HOME": str(home),
            "VERL_LINES_OUT": out,
            "VERL_ENTRIES": " ".join(ENTRIES),
            # bash's own builtins: a missing vendor setup file or a limit it may not raise stops nothing
            "BASH_FUNC_source%%": '() { [ -f "$1" ] && builtin source "$@"; return 0; }',
            "BASH_FUNC_ulimit%%": "() { return 0; }",
        }
        subprocess.run(
            ["bash", str(script)],
            cwd=tree,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
        found = sorted(Path(out).iterdir(), key=lambda p: int(p.name))
        return [[_portable(a, tree, home) for a in p.read_bytes().decode().split("\0")[:-1]] for p in found]


def _portable(arg: str, tree: Path, home: Path) -> str:
    return arg.replace(str(tree), CHECKOUT).replace(str(home), HOME)


def extract(mirror: Path = MIRROR, commit: str = "HEAD") -> dict[str, Any]:
    """Every launch line of verl's scripts at ``commit``: ``{"commit", "lines": [{script, entry, args}]}``."""
    sha = subprocess.run(
        ["git", "-C", str(mirror), "rev-parse", commit], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        tree, stubs, home = Path(work, "verl"), Path(work, "stubs"), Path(work, "home")
        for folder in (tree, stubs, home):
            folder.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(mirror), "archive", sha, "examples", "verl/experimental", "tests/special_e2e"],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        write_stubs(stubs)
        lines = []
        for script in script_paths(tree):
            for args in calls(script, tree, stubs, home):
                lines.append({"script": str(script.relative_to(tree)), "entry": args[1], "args": args[2:]})
    return {"verl_commit": sha, "lines": lines}


# ---------------------------------------------------------------------------- families
_VISION = re.compile(r"(geo3k|-VL-|_vl|glm-?4\.1v|minicpm-?o)", re.IGNORECASE)
_VISION_KEYS = ("data.train_files", "data.val_files", "actor_rollout_ref.model.path")


def family(line: dict[str, Any]) -> str:
    """The family a line is counted in: its entry point's, or for main_ppo what it trains."""
    kind = ENTRIES[line["entry"]]
    if kind != "main_ppo":
        return kind
    values = dict(_split(arg) for arg in line["args"])
    if any(_VISION.search(str(values.get(key, ""))) for key in _VISION_KEYS):
        return "vlm"
    megatron = "megatron" in values.get("--config-name", "")
    return "megatron" if megatron or values.get("actor_rollout_ref.actor.strategy") == "megatron" else "fsdp"


def _split(arg: str) -> tuple[str, str]:
    key, _, value = arg.partition("=")
    return key.lstrip("+"), value


# ---------------------------------------------------------------------------- paths swapped
REPO = Path(__file__).resolve().parents[3]
REWARD_FILE = Path(__file__).with_name("verl_scripts") / "reward_fn.py"
_MODEL_PATH = re.compile(r"(model\.path|model_path|tokenizer_path|input_tokenizer)$")


def swapped(args: list[str]) -> list[str]:
    """``args`` with their paths pointed at this machine: data files and models at dummy paths (``--cfg
    job`` reads neither), a custom reward function at a file of this checkout, and verl's checkout
    at this one (``--config-path``, tool and interaction files: the same relative paths)."""
    return [_swap(arg) for arg in args]


def _swap(arg: str) -> str:
    plus = arg[: len(arg) - len(arg.lstrip("+"))]
    key, eq, value = arg[len(plus) :].partition("=")
    if not eq:
        return arg
    if key.endswith("custom_reward_function.path"):
        value = str(REWARD_FILE)
    elif key in ("data.train_files", "data.val_files"):
        value = _each_path(value, "/data", f"{key[5:-6]}.parquet")
    elif key.endswith("dist_checkpointing_path"):
        value = "/checkpoints/dist_ckpt"
    elif _MODEL_PATH.search(key) and value not in ("null", "None"):
        value = _each_path(value, "/models", "model")
    elif value == CHECKOUT or value.startswith(CHECKOUT + "/"):
        value = str(REPO) + value[len(CHECKOUT) :]
    elif key == "trainer.default_local_dir" and not value:
        value = "/checkpoints/run"
    return f"{plus}{key}={value}"


def _each_path(value: str, folder: str, default: str) -> str:
    """Each path of ``value`` (one path, or a list ``[a, b]``) as ``folder/<its file name>``."""
    names = [re.sub(r"[<>'\"]", "", p).strip() for p in value.strip("[]").split(",")]
    paths = [f"{folder}/{Path(name).name or default}" for name in names]
    return f"[{','.join(paths)}]" if value.startswith("[") else paths[0]


# ---------------------------------------------------------------------------- --cfg job
ENTRY_CHECKS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "verl.trainer.main_ppo": ("ppo_trainer", refuse_recipe_only_keys),
    "verl.trainer.main_ppo_sync": ("ppo_trainer", main_ppo_sync.check_sync_entry),
    "verl.trainer.main_generation_server": ("ppo_trainer", main_generation_server.check_generation_config),
    fully_async_main.ENTRY: (fully_async_main.CONFIG_NAME, fully_async_main.check_fully_async),
    one_step_off_main.ENTRY: (one_step_off_main.CONFIG_NAME, one_step_off_main.check_one_step_off),
}
"""Each entry point's preset and its own check of the config, as its ``__main__`` block passes them."""

BROKEN_IN_VERL = {
    "examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh": (
        "LexerNoViableAltException",
        "a comment after a line's backslash hands Hydra a lone ' ' argument and ends the command",
    ),
    "examples/grpo_trainer/run_qwen3_4b_grpo_vllm_1k_npu.sh": (
        "extraneous input '}'",
        "trainer.experiment_name ends in a stray '}', which Hydra's override grammar refuses",
    ),
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh": (
        "use_kl_loss: Value '' is not a valid bool",
        "use_kl_loss=${use_kl_loss} of an unset variable: '', which verl's start-up typing of the actor "
        "section refuses too (here --cfg job types the config)",
    ),
    "verl/experimental/fully_async_policy/shell/dapo_30b_a3b_base_math_fsdp.sh": (
        "Cannot find primary config 'fully_async_dapo_trainer.yaml'",
        "--config-name=fully_async_dapo_trainer.yaml names a file verl's repository never had",
    ),
}
"""verl's lines that fail in verl as well, with the error expected here and why verl fails too."""


@dataclass
class Outcome:
    error: str | None
    """The line ``python -m entry ARGS --cfg job`` prints on stderr, None when it resolves."""
    refusal: str | None
    """For a line that resolves, the line a run of it stops with at start-up (None: it starts)."""


def resolve(entry: str, args: list[str]) -> Outcome:
    """``python -m entry ARGS --cfg job`` as each entry point's ``__main__`` block runs it (it composes,
    types and validates the config before Hydra prints it; a mistake is one line on stderr and exit
    status 1), and what a run of it would refuse at start-up (:mod:`verl.config.start_up`)."""
    name, entry_check = ENTRY_CHECKS[entry]
    if entry == "verl.trainer.main_generation_server":
        args = main_generation_server.with_generation_defaults(args)
    refusals: list[str] = []

    def check(config: Any) -> None:
        entry_check(config)
        try:
            refuse_at_start_up(config)
        except ConfigError as refused:
            refusals.append(f"Error in the config: {refused}")

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            prepare_argv([*args, "--cfg", "job"], name, CONFIG_DIR, entry_check=check)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return Outcome(lines[-1] if lines else "exit without a message", None)
    return Outcome(None, refusals[0] if refusals else None)


def count(lines: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """``{family: (lines that resolve, lines)}``."""
    out = {name: [0, 0] for name in FAMILIES}
    for line in lines:
        tally = out[family(line)]
        tally[0] += resolve(line["entry"], swapped(line["args"])).error is None
        tally[1] += 1
    return {name: (ok, total) for name, (ok, total) in out.items()}


def load_record() -> dict[str, Any]:
    return json.loads(RECORD.read_text())


def save_record(record: dict[str, Any]) -> None:
    RECORD.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["record"]:
        save_record(extract())
        print(f"{len(load_record()['lines'])} lines -> {RECORD}")
    elif sys.argv[1:] == ["count"]:
        for name, (ok, total) in count(load_record()["lines"]).items():
            print(f"{name}: {ok}/{total}")
    else:
        sys.exit("usage: python -m tests.trainer.config.verl_current_lines record|count")
