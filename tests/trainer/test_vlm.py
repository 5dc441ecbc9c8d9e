"""The built-in vision-language preset end to end on Ray: the trainer's log-probs of a generated batch
equal a plain transformers forward of the model over the same images (which builds its own M-RoPE
positions), the rollout's equal the trainer's at fp32 level, and GRPO teaches the tiny Qwen2-VL to
read the digits. Also: the settings a vision-language policy cannot use here are refused by name (its
critic: tests/trainer/test_vlm_critic.py)."""

from __future__ import annotations

import pytest
import torch

from verl.builtin.assets import prepare_ppo_assets
from verl.config.ppo_trainer import load_config
from verl.model_merger.fsdp import merge_fsdp_checkpoint
from verl.protocol import DataProto
from verl.trainer.ppo.builders import build_tokenizer
from verl.trainer.ppo.dataloaders import build_dataloaders
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.dataset.vision import image_messages, load_image, load_vision_processor
from verl.utils.metric import reduce_metrics
from verl.workers.vision import MULTI_MODAL_INPUTS, micro_batch_vision

PRESET = "vlm_trainer"


def transformers_log_probs(model_path: str, batch: DataProto) -> torch.Tensor:
    """Log-probs of the responses from Qwen2-VL's own forward: its positions from ``mm_token_type_ids``."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    vision = micro_batch_vision(batch.non_tensor_batch[MULTI_MODAL_INPUTS])
    token_types = (ids == model.config.image_token_id).int()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, mm_token_type_ids=token_types, **vision).logits
    responses = batch.batch["responses"]
    head = logits[:, -responses.shape[1] - 1 : -1].float()
    return torch.log_softmax(head, -1).gather(-1, responses[..., None])[..., 0]


def transformers_greedy_accuracy(model_dir: str, val_file: str) -> float:
    """Greedy accuracy on the task's rows of a model folder loaded by transformers alone."""
    import pyarrow.parquet as pq
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = load_vision_processor(model_dir, tokenizer)
    assert processor is not None  # the image processor's files went with the weights
    rows = pq.read_table(val_file).to_pylist()
    texts, pixels, grids = [], [], []
    for row in rows:
        vision = processor.images([load_image(image, "val") for image in row["images"]])
        messages = image_messages(row["prompt"], len(row["images"]), "val")
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        texts.append(processor.expand(text, vision["image_grid_thw"]))
        pixels.append(vision["pixel_values"])
        grids.append(vision["image_grid_thw"])
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    token_types = (inputs["input_ids"] == processor.image_token_id).int()
    with torch.no_grad():
        out = model.generate(
            **inputs,
            pixel_values=torch.cat(pixels),
            image_grid_thw=torch.cat(grids),
            mm_token_type_ids=token_types,
            max_new_tokens=3,
            do_sample=False,
        )
    answers = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    truth = [row["reward_model"]["ground_truth"] for row in rows]
    return sum(a.strip() == t for a, t in zip(answers, truth)) / len(rows)


@pytest.mark.usefixtures("ray_session")
def test_the_vlm_preset_matches_transformers_and_learns_to_read_digits(tmp_path):
    overrides = [
        f"trainer.default_local_dir={tmp_path}",
        "trainer.logger=[]",
        "trainer.total_training_steps=75",
        "trainer.test_freq=75",  # the first and the last validation are the ones compared
        "trainer.save_freq=75",
        "actor_rollout_ref.rollout.calculate_log_probs=True",  # the rollout's own log-probs, to compare
    ]
    config = load_config(overrides, PRESET)
    prepare_ppo_assets(config)
    trainer = RayPPOTrainer(config)
    try:
        trainer.init_workers()
        batch = trainer._repeat_prompts(next(trainer._batches()).batch)
        trainer.global_steps = 1
        batch = trainer._generate(batch, {})
        assert batch.batch["position_ids"].shape[1] == 3  # M-RoPE positions, built once by the dataset
        mask = batch.batch["response_mask"].bool()
        actor = trainer.actor_rollout_wg.compute_log_prob(batch).batch["old_log_probs"]
        expected = transformers_log_probs(config.actor_rollout_ref.model.path, batch)
        assert torch.allclose(actor[mask], expected[mask], atol=1e-5), (actor - expected)[mask].abs().max()
        gap = (batch.batch["rollout_log_probs"] - actor)[mask].abs().max()
        assert gap < 1e-5, gap  # the rollout generated from the same images and positions
        trainer.fit()
    finally:
        trainer.close()
    accuracy = [metrics["val-core/vision_digits/acc/mean@1"] for _, metrics in trainer.validator.history]
    assert accuracy[-1] >= accuracy[0] + 0.25, accuracy
    # the merger exports a model transformers loads (image processor included) that reads as well
    exported = merge_fsdp_checkpoint(str(tmp_path / "global_step_75" / "actor"), str(tmp_path / "hf"))
    assert transformers_greedy_accuracy(exported, config.data.val_files) == pytest.approx(
        accuracy[-1], abs=0.011
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (["actor_rollout_ref.rollout.name=vllm"], "actor_rollout_ref.rollout.name"),
        (
            [
                "algorithm.adv_estimator=gae",
                "critic.ulysses_sequence_parallel_size=2",
                "critic.model.use_remove_padding=True",
            ],
            r"critic\.ulysses_sequence_parallel_size",
        ),
        (
            [
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "actor_rollout_ref.model.use_remove_padding=True",
            ],
            "ulysses_sequence_parallel_size",
        ),
    ],
)
def test_roles_a_vision_policy_cannot_use_here_are_refused(override, key):
    config = load_config(override, PRESET)
    prepare_ppo_assets(config)
    with pytest.raises(ValueError, match=key):
        build_dataloaders(config, build_tokenizer(config))


# Before the data-parallel test: its one-rank pool has this run's shape and reuses its process.
@pytest.mark.usefixtures("ray_session")
def test_remax_baselines_are_generated_from_the_images(tmp_path, monkeypatch):
    """ReMax's greedy baseline generation gets the rows' images too (a prompt's image tokens
    without its pictures would fail the forward)."""
    from verl.trainer.main_ppo import run_ppo

    monkeypatch.chdir(tmp_path)
    overrides = [
        "algorithm.adv_estimator=remax",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[]",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
        f"trainer.default_local_dir={tmp_path}",
    ]
    config = load_config(overrides, PRESET)
    prepare_ppo_assets(config)
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 1 and metrics["actor/grad_norm"] > 0


def _trainer(tmp_path, ranks: int) -> RayPPOTrainer:
    overrides = [
        f"trainer.default_local_dir={tmp_path}",
        "trainer.logger=[]",
        f"trainer.n_gpus_per_node={ranks}",
        # the two CPUs either way; both layouts start in the processes the runs above left
        # (VERL_REUSE_WORKER_PROCESSES, tests/conftest.py)
        f"trainer.cpus_per_worker={2 // ranks}",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
    ]
    config = load_config(overrides, PRESET)
    prepare_ppo_assets(config)
    trainer = RayPPOTrainer(config)
    trainer.init_workers()
    return trainer


@pytest.mark.usefixtures("ray_session")
def test_two_data_parallel_ranks_equal_one_on_an_image_batch(tmp_path):
    one = _trainer(tmp_path / "one", 1)
    try:
        batch = one._repeat_prompts(next(one._batches()).batch)
        one.global_steps = 1
        batch = one._generate(batch, {})
        batch.union(one.actor_rollout_wg.compute_log_prob(batch))
        batch.batch["advantages"] = torch.randn(
            batch.batch["responses"].shape, generator=torch.Generator().manual_seed(0)
        )
        expected = reduce_metrics(one.actor_rollout_wg.update_actor(batch).meta_info["metrics"])
    finally:
        one.close()
    two = _trainer(tmp_path / "two", 2)
    try:
        log_probs = two.actor_rollout_wg.compute_log_prob(batch).batch["old_log_probs"]
        got = reduce_metrics(two.actor_rollout_wg.update_actor(batch).meta_info["metrics"])  # the ranks' mean
    finally:
        two.close()
    mask = batch.batch["response_mask"].bool()
    assert torch.allclose(log_probs[mask], batch.batch["old_log_probs"][mask], atol=1e-6)
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5), key
