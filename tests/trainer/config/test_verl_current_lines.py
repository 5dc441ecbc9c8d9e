"""verl's current launch lines, as its scripts write them (paths swapped only), resolve with ``--cfg
job``: each line of ``verl_current_lines.json`` (extracted from verl's repository by
``verl_current_lines.py``), per family, through each entry point's own ``__main__`` checks. What a
line asks that this project cannot run is refused when the run starts, in one line naming the key;
a line that fails in verl as well (:data:`BROKEN_IN_VERL`) fails here with the same fault."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.trainer.config.test_verl_head_keys import VERL_COMMIT
from tests.trainer.config.verl_current_lines import (
    BROKEN_IN_VERL,
    CHECKOUT,
    FAMILIES,
    MIRROR,
    REPO,
    extract,
    family,
    load_record,
    resolve,
    swapped,
)

RECORD = load_record()
BY_FAMILY: dict[str, list[dict]] = defaultdict(list)
for _line in RECORD["lines"]:
    BY_FAMILY[family(_line)].append(_line)
_KEY = re.compile(r"^Error in the config: [a-z_]+(\.[A-Za-z0-9_]+)+[=:]")


@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"no copy of verl's repository at {MIRROR} (VERL_REPO)")
def test_the_record_is_every_launch_line_of_verls_scripts_at_its_commit():
    assert extract(MIRROR, RECORD["verl_commit"]) == RECORD


def test_the_record_has_every_family_verls_scripts_launch():
    assert len(RECORD["lines"]) >= 140
    assert {name for name in FAMILIES if BY_FAMILY[name]} >= set(FAMILIES) - {"main_ppo_sync"}
    assert set(BROKEN_IN_VERL) <= {line["script"] for line in RECORD["lines"]}


@pytest.mark.parametrize("name", FAMILIES)
def test_each_line_of_the_family_resolves_with_cfg_job_and_a_refusal_names_its_key(name):
    lines = BY_FAMILY[name]
    if not lines:
        pytest.skip(f"verl's scripts at {RECORD['verl_commit'][:7]} launch no {name} line")
    failed, broken, refusals = [], [], []
    for line in lines:
        outcome = resolve(line["entry"], swapped(line["args"]))
        if line["script"] in BROKEN_IN_VERL:
            broken.append((line["script"], outcome.error))
        elif outcome.error is not None:
            failed.append((line["script"], outcome.error))
        elif outcome.refusal is not None:
            refusals.append((line["script"], outcome.refusal))
    ok = len(lines) - len(failed) - len(broken)
    assert not failed, f"{name}: {ok}/{len(lines)} resolve; failing: {failed}"
    for script, error in broken:
        assert error is not None and BROKEN_IN_VERL[script][0] in error, (script, error)
    for script, refusal in refusals:
        assert _KEY.match(refusal) and "\n" not in refusal, (script, refusal)


def test_the_paths_of_a_line_are_all_that_is_swapped():
    args = [
        "data.train_files=['/verl/data/a.parquet', '/verl/data/b.parquet']",
        "actor_rollout_ref.model.path=<path_to_dsv3_config>",
        f"--config-path={CHECKOUT}/examples/sglang_multiturn/config",
        "actor_rollout_ref.actor.megatron.dist_checkpointing_path=",
        "+reward_model.model.path=null",
        "actor_rollout_ref.rollout.n=16",
    ]
    assert swapped(args) == [
        "data.train_files=[/data/a.parquet,/data/b.parquet]",
        "actor_rollout_ref.model.path=/models/path_to_dsv3_config",
        f"--config-path={REPO}/examples/sglang_multiturn/config",
        "actor_rollout_ref.actor.megatron.dist_checkpointing_path=/checkpoints/dist_ckpt",
        "+reward_model.model.path=null",
        "actor_rollout_ref.rollout.n=16",
    ]


def test_a_line_cfg_job_prints_is_refused_when_it_runs_in_one_line_naming_the_key():
    """The command line itself: Qwen3-VL on Megatron with context parallel 2 prints its config with
    ``--cfg job`` (exit 0), and its run stops at start-up, before Ray, naming the key."""
    (line,) = [x for x in RECORD["lines"] if x["script"].endswith("run_qwen3_vl-8b-megatron.sh")]
    args = [sys.executable, "-m", line["entry"], *swapped(line["args"])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    printed = subprocess.run([*args, "--cfg", "job"], capture_output=True, text=True, env=env, cwd=REPO)
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert "context_parallel_size: 2" in printed.stdout
    run = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert run.returncode == 1
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "Error in the config: actor_rollout_ref.actor.megatron.context_parallel_size=2: megatron-core's local "
            "layer spec (no Transformer Engine)"
        )
    )


def test_verls_multi_turn_presets_are_here_under_the_same_names():
    names = {
        Path(arg.split("=", 1)[1]).name + ".yaml"
        for line in RECORD["lines"]
        for arg in line["args"]
        if arg.startswith("--config-name=") and "multiturn" in arg
    }
    assert names and all((REPO / "examples/sglang_multiturn/config" / name).is_file() for name in names)


def test_the_lines_and_the_head_keys_come_from_one_commit_of_verl():
    assert RECORD["verl_commit"] == VERL_COMMIT
