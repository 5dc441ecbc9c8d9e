"""Generate responses for a parquet of prompts on the rollout servers (verl's ``main_generation_server``).

One CPU (the built-in tiny model on the built-in arithmetic prompts, 4 responses each)::

    python -m verl.trainer.main_generation_server data.train_files=~/.cache/verl/data/arith/test.parquet \\
        actor_rollout_ref.rollout.n=4 +data.output_path=~/data/gen/arith.parquet

One GPU (verl's launch line, ``tests/special_e2e/generation/run_gen_qwen05_server.sh``)::

    python -m verl.trainer.main_generation_server trainer.nnodes=1 trainer.n_gpus_per_node=1 \\
        actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct actor_rollout_ref.rollout.name=vllm \\
        actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=0.7 \\
        actor_rollout_ref.rollout.response_length=1024 actor_rollout_ref.rollout.n=4 \\
        data.train_files=~/data/gsm8k/test.parquet data.prompt_key=prompt +data.output_path=~/data/gen/out.parquet

A cluster: start Ray on every node, then add ``ray_init.address=auto trainer.nnodes=N``.

The config is the PPO trainer's (``--config-name ppo_trainer``, the same loader and one-line errors
as ``main_ppo``). The rows of ``data.train_files`` (``data.train_max_samples`` of them, if set) are
read; ``trainer.nnodes x n_gpus_per_node`` rollout ranks start, each ``rollout.tensor_model_parallel_size``
of them one engine (``rollout.name``: hf, vllm, sglang) behind the project's OpenAI-compatible server;
each row's chat messages (``data.prompt_key``) go ``rollout.n`` times to ``/v1/chat/completions``
with ``temperature``, ``top_p``, ``top_k`` and ``max_tokens=rollout.response_length``. The input rows
plus a ``responses`` column (``n`` strings per row) are written to ``data.output_path``: a temporary
file, then a rename. Score the file with ``python -m verl.trainer.main_eval data.path=<output_path>``.

Beyond verl: each request carries the seed ``derived_seed(rollout.seed, sample)``, so a run repeats
exactly on the hf engine; ``top_k`` is sent (verl leaves it out); a prompt longer than
``rollout.prompt_length`` tokens is an error naming its row (verl's vLLM fails on it mid-run).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import hydra
import pandas as pd
from omegaconf import DictConfig

from verl.builtin.assets import prepare_ppo_assets
from verl.config.base import check
from verl.config.cli import prepare_argv, user_errors_as_one_line
from verl.config.ppo_trainer import CONFIG_DIR, PPOTrainerConfig, load_config, to_typed_config
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, create_colocated_worker_groups
from verl.trainer.offline_data import (
    check_sequence,
    file_list,
    read_parquet_files,
    require_column,
    row_location,
    write_parquet_atomically,
)
from verl.trainer.ppo import builders
from verl.utils.dataset.schema import DatasetError, normalize_value
from verl.workers.rollout.sampling import derived_seed
from verl.workers.rollout.server_client import post_json

MAX_IN_FLIGHT = 256
"""Requests open at once (one thread each); the servers batch whatever is running."""
# verl composes its own ppo_trainer.yaml, whose estimator is gae; this project's preset picks grpo for
# its training default, and the trainer refuses greedy sampling with grpo, which generation allows.
# The rollout runs as a server loading the model's own weights (no trainer sends it any).
GENERATION_DEFAULTS = {
    "algorithm.adv_estimator": "gae",
    "actor_rollout_ref.rollout.mode": "async",
    "actor_rollout_ref.rollout.load_format": "auto",
}


def with_generation_defaults(overrides: list[str]) -> list[str]:
    """``overrides`` plus ``GENERATION_DEFAULTS`` for each key they do not set themselves, placed
    next to the overrides (Hydra's parser wants them in one run, apart from flags like ``--cfg job``)."""
    positions = [i for i, o in enumerate(overrides) if "=" in o and not o.startswith("-")]
    given = {overrides[i].split("=", 1)[0].lstrip("+~") for i in positions}
    defaults = [f"{k}={v}" for k, v in GENERATION_DEFAULTS.items() if k not in given]
    at = positions[0] if positions else len(overrides)
    return [*overrides[:at], *defaults, *overrides[at:]]


def load_generation_config(overrides: list[str] | None = None) -> PPOTrainerConfig:
    """The config ``python -m verl.trainer.main_generation_server <overrides>`` runs with."""
    return load_config(with_generation_defaults(list(overrides or [])))


def check_generation_config(config: PPOTrainerConfig) -> None:
    """What generation needs beyond the trainer's checks: an output file, n=1 when decoding greedily,
    a server (``rollout.mode=async``) that loads real weights."""
    rollout, key = config.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    output = config.data.output_path
    check(bool(output), "data.output_path", "the parquet file to write (+data.output_path=...)", output)
    greedy = rollout.temperature == 0 or not rollout.do_sample
    why = "1 when decoding greedily (temperature=0 or do_sample=False gives the same response n times)"
    check(not greedy or rollout.n == 1, f"{key}.n", why, rollout.n)
    check(
        rollout.mode == "async",
        f"{key}.mode",
        "async (generation runs the rollout as a server)",
        rollout.mode,
    )
    check(
        not rollout.load_format.startswith("dummy"),
        f"{key}.load_format",
        "auto (a dummy format starts the engine with random weights; nothing here sends it real ones)",
        rollout.load_format,
    )


def run_generation(config: PPOTrainerConfig) -> pd.DataFrame:
    """Generate ``rollout.n`` responses per row of ``data.train_files`` and write the rows with
    them to ``data.output_path``; returns the frame written."""
    check_generation_config(config)
    prepare_ppo_assets(config)
    frame, chats = read_prompts(config)
    check_prompt_lengths(chats, builders.build_tokenizer(config), config)
    builders.init_ray(config)
    try:
        with rollout_servers(config) as addresses:
            frame["responses"] = generate_responses(addresses, chats, config)
    finally:
        builders.write_ray_timeline(config)
    path = write_parquet_atomically(frame, config.data.output_path)
    n = config.actor_rollout_ref.rollout.n
    print(f"wrote {len(frame)} rows with {n} response(s) each to {path}", flush=True)
    return frame


def read_prompts(config: PPOTrainerConfig) -> tuple[pd.DataFrame, list[list[dict[str, Any]]]]:
    """The rows of ``data.train_files`` (the first ``data.train_max_samples``) and each row's chat
    messages; a plain string prompt is one user message."""
    data, key = config.data, "data.train_files"
    frame = read_parquet_files(data.train_files, key)
    require_column(frame, data.prompt_key, "data.prompt_key", data.train_files)
    if data.train_max_samples > 0:
        frame = frame.iloc[: data.train_max_samples].reset_index(drop=True)
    chats = []
    for row, prompt in enumerate(frame[data.prompt_key]):
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        where = row_location(key, row, data.prompt_key)
        messages = normalize_value(check_sequence(prompt, where, "a list of chat messages"))
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise DatasetError(f"{where}: expected chat messages like [{{'role': 'user', 'content': '...'}}]")
        chats.append(messages)
    return frame, chats


def check_prompt_lengths(chats: list[list[dict[str, Any]]], tokenizer: Any, config: PPOTrainerConfig) -> None:
    """Every prompt, rendered with the chat template as the servers render it, fits ``rollout.prompt_length``."""
    limit = config.actor_rollout_ref.rollout.prompt_length
    for row, messages in enumerate(chats):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        length = len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)
        if length > limit:
            files = ", ".join(file_list(config.data.train_files))
            raise DatasetError(
                f"{row_location(files, row, config.data.prompt_key)}: the prompt has {length} tokens, more than "
                f"actor_rollout_ref.rollout.prompt_length={limit}; raise it or drop the row"
            )


@contextmanager
def rollout_servers(config: PPOTrainerConfig) -> Iterator[list[str]]:
    """Start the rollout ranks (``nnodes x n_gpus_per_node``, role ``rollout`` in server mode), yield
    one server address per engine, and shut them down on leaving."""
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    trainer = config.trainer
    pool = RayResourcePool(
        [trainer.n_gpus_per_node] * trainer.nnodes,
        use_gpu=builders.resolve_device(config) == "cuda",
        name_prefix="generation_pool",
        cpus_per_process=trainer.cpus_per_worker,
    )
    worker = RayClassWithInitArgs(
        ActorRolloutRefWorker,
        config.actor_rollout_ref,
        role="rollout",
        tokenizer=builders.tokenizer_source(config),
    )
    groups: dict[str, Any] = {}
    try:
        groups = create_colocated_worker_groups(
            pool,
            {"rollout": worker},
            call_timeout_s=trainer.worker_call_timeout_s,
            setup_timeout_s=trainer.ray_wait_register_center_timeout,
        )
        groups["rollout"].init_model()
        yield builders.server_addresses(groups["rollout"])
    finally:
        for group in groups.values():
            group.shutdown()
        pool.release()


def chat_request(config: PPOTrainerConfig) -> dict[str, Any]:
    """The body every request shares: the model and the sampling parameters of ``rollout``."""
    rollout = config.actor_rollout_ref.rollout
    return {
        "model": config.actor_rollout_ref.model.path,
        "temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
        "max_tokens": rollout.response_length,
    }


def generate_responses(
    addresses: list[str], chats: list[list[dict[str, Any]]], config: PPOTrainerConfig
) -> list[list[str]]:
    """``rollout.n`` completions of each chat, one request each; row ``i``'s go to server ``i % len(addresses)``."""
    rollout = config.actor_rollout_ref.rollout
    n, body = rollout.n, chat_request(config)
    requests = [
        (
            addresses[row % len(addresses)],
            {**body, "messages": chat, "seed": derived_seed(rollout.seed, row * n + j)},
        )
        for row, chat in enumerate(chats)
        for j in range(n)
    ]
    texts = _post_all(requests, rollout.server.timeout_s)
    return [texts[row * n : (row + 1) * n] for row in range(len(chats))]


def _post_all(requests: list[tuple[str, dict[str, Any]]], timeout_s: float) -> list[str]:
    """The message text of each request's first choice, in order; the first failure is raised and
    the requests not yet sent are dropped."""
    pool = ThreadPoolExecutor(
        max_workers=max(1, min(MAX_IN_FLIGHT, len(requests))), thread_name_prefix="generate"
    )
    try:
        futures = [pool.submit(_chat, address, body, timeout_s) for address, body in requests]
        return [future.result() for future in futures]  # each request has its own time-out
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _chat(address: str, body: dict[str, Any], timeout_s: float) -> str:
    # a margin over the server's own limit, so that its message (which names the key) is the one seen
    completion = post_json(f"{address}/v1/chat/completions", body, timeout_s + 30)
    return completion["choices"][0]["message"]["content"]


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    with user_errors_as_one_line():
        run_generation(to_typed_config(cfg))


if __name__ == "__main__":
    argv = with_generation_defaults(sys.argv[1:])
    sys.argv[1:] = prepare_argv(argv, "ppo_trainer", CONFIG_DIR, entry_check=check_generation_config)
    main()
