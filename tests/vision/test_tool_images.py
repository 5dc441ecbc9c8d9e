"""A vision-language policy's tool agent: a tool answers with a picture and the next turn sees it.

A tiny Qwen2-VL (:mod:`tests.vision.tool_vlm`) memorises one conversation (a picture and ``look``;
it calls ``zoom``; the tool answers with a second picture and ``zoomed``; it answers ``7``), so the
real hf rollout server, driven by the real tool agent loop, replays it with greedy decoding. The
row that comes back holds both pictures' inputs, its M-RoPE positions equal transformers'
``get_rope_index`` over the whole sequence, and the trainer's forward gives the log-probs of
transformers' own forward of that row.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.vision.conftest import random_png
from tests.vision.image_tools import tool_image
from tests.vision.tool_vlm import ANSWER, PROMPT, PROMPT_IMAGE, cached_tool_vlm, conversation
from verl.builtin import vision_task
from verl.config.ppo_trainer import load_config
from verl.experimental.agent_loop.manager import AgentLoopManager
from verl.protocol import DataProto
from verl.tools.schemas import ToolResponse
from verl.trainer.ppo.prompts import attach_responses, pop_prompts
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.utils.dataset.vision import load_vision_processor
from verl.utils.model import eos_token_ids, load_causal_lm, load_tokenizer
from verl.workers.engine.micro_batch import split_micro_batches
from verl.workers.forward import POLICY_INPUT_KEYS, response_log_probs
from verl.workers.packing import enable_packing
from verl.workers.rollout import build_server
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.vision import MULTI_MODAL_INPUTS, micro_batch_vision

TOOLS_YAML = """
tools:
  - class_name: tests.vision.image_tools.ZoomTool
    config: {}
"""


def agent_overrides(model_path: str, tools_yaml: Path, max_prompt_length: int) -> list[str]:
    """The tool agent on the hf rollout server over ``model_path``, with the tools of ``TOOLS_YAML``."""
    tools_yaml.write_text(TOOLS_YAML)
    return [
        f"actor_rollout_ref.model.path={model_path}",
        "preset=embedded",  # a tiny model of its own: the embedded default's CPU sizes
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns=1",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools_yaml}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "data.return_raw_chat=True",
        f"data.max_prompt_length={max_prompt_length}",
        "data.max_response_length=96",
    ]


def agent_config(model_path: str, tools_yaml: Path, max_prompt_length: int):
    return load_config(agent_overrides(model_path, tools_yaml, max_prompt_length))


def serve(config, tokenizer):
    """The hf rollout server (loopback HTTP) over the config's model, and an agent loop manager on it."""
    model_path = config.actor_rollout_ref.model.path
    rollout_cfg = config.actor_rollout_ref.rollout
    model = load_causal_lm(config.actor_rollout_ref.model)
    rollout = HFRollout(
        model,
        rollout_cfg,
        tokenizer.pad_token_id,
        eos_token_ids(tokenizer, model_path),
        torch.device("cpu"),
        0,
    )
    server, front = build_server(rollout, rollout_cfg, tokenizer, "tool-vlm")
    return server, front, AgentLoopManager(config, [front.address], tokenizer)


@pytest.fixture(scope="module")
def image_agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("tool-images")
    config = agent_config(cached_tool_vlm(), root / "tools.yaml", max_prompt_length=16)
    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path)
    server, front, manager = serve(config, tokenizer)
    yield config, tokenizer, manager, root
    manager.close()
    front.close()
    server.close()


def write_rows(path: Path, rows: int) -> None:
    """``rows`` copies of the conversation's prompt in verl's row schema (scored as the digit task's)."""
    record = {
        "data_source": vision_task.VISION_DATA_SOURCE,
        "prompt": [{"role": "user", "content": PROMPT}],
        "images": [{"bytes": random_png(*PROMPT_IMAGE, seed=3)}],
        "reward_model": {"ground_truth": ANSWER},
    }
    pq.write_table(pa.Table.from_pylist([record] * rows), path)


def dataset_batch(config, tokenizer, root: Path, rows: int) -> DataProto:
    """``rows`` copies of the conversation's prompt through the RL dataset, as the trainer batches them."""
    write_rows(root / "rows.parquet", 1)
    processor = load_vision_processor(config.actor_rollout_ref.model.path, tokenizer)
    dataset = RLHFDataset(str(root / "rows.parquet"), tokenizer, config.data, processor)
    return DataProto.from_single_dict(collate_fn([dataset[0] for _ in range(rows)]))


def rollout(config, tokenizer, manager, root: Path) -> DataProto:
    """Two trajectories, greedy, through the path the trainer takes (pop the prompts, generate, attach)."""
    batch = dataset_batch(config, tokenizer, root, rows=2)
    prompts = pop_prompts(batch, True)
    prompts.meta_info["do_sample"] = False
    attach_responses(batch, manager.generate_sequences(prompts))
    return batch


def transformers_log_probs(
    model_path: str, batch: DataProto, vision: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Log-probs of the responses from one forward of transformers' Qwen2-VL, which builds its own
    M-RoPE positions (from ``mm_token_type_ids`` and the images' grids)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    token_types = (ids == model.config.image_token_id).int()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, mm_token_type_ids=token_types, **vision).logits
    responses = batch.batch["responses"]
    head = logits[:, -responses.shape[1] - 1 : -1].float()
    return torch.log_softmax(head, -1).gather(-1, responses[..., None])[..., 0]


def trainer_log_probs(model, batch: DataProto, packed: bool) -> torch.Tensor:
    """The trainer's forward (:func:`verl.workers.forward.response_log_probs`) over the batch's rows."""
    data = batch.select(batch_keys=POLICY_INPUT_KEYS, non_tensor_batch_keys=[MULTI_MODAL_INPUTS])
    micro_batches, _ = split_micro_batches(data, POLICY_INPUT_KEYS, None)
    with torch.no_grad():
        return torch.cat(
            [response_log_probs(model, m, 1.0, packed=packed)["log_probs"] for m in micro_batches]
        )


def test_a_tool_image_joins_the_row_and_the_trainer_sees_both_images(image_agent):
    config, tokenizer, manager, root = image_agent
    batch = rollout(config, tokenizer, manager, root)
    processor = load_vision_processor(config.actor_rollout_ref.model.path, tokenizer)
    ids, labels, vision = conversation(tokenizer, processor)
    width = config.actor_rollout_ref.rollout.prompt_length
    n = int(batch.batch["attention_mask"][0, width:].sum())  # response tokens: call, tool turn, answer
    prompt_length = len(ids) - n
    # the memorised conversation came back: the call, the tool's picture and text, the answer
    columns = batch.non_tensor_batch[MULTI_MODAL_INPUTS]
    for row in range(2):
        real = batch.batch["attention_mask"][row].bool()
        assert batch.batch["input_ids"][row][real].tolist() == ids
        model_tokens = [int(label != -100) for label in labels[prompt_length:]]
        assert batch.batch["response_mask"][row, :n].tolist() == model_tokens  # 0 on the tool turn
        assert torch.equal(columns[row]["image_grid_thw"], torch.tensor([[1, 4, 4], [1, 4, 8]]))
        assert torch.equal(
            columns[row]["pixel_values"], vision["pixel_values"]
        )  # the prompt's, then the tool's

    # M-RoPE positions of the whole sequence equal transformers' rope index with both images
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(config.actor_rollout_ref.model.path, dtype=torch.float32)
    input_ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    all_images = micro_batch_vision(columns)
    expected, _ = hf.model.get_rope_index(
        input_ids,
        (input_ids == processor.image_token_id).int(),
        image_grid_thw=all_images["image_grid_thw"],
        attention_mask=mask,
    )
    positions = batch.batch["position_ids"]
    assert positions.shape == (2, 3, input_ids.shape[1])
    for row in range(2):
        real = mask[row].bool()
        assert torch.equal(positions[row][:, real], expected[:, row, real]), row

    # the trainer's log-probs of the row (padded and packed) equal one transformers forward on it
    model = load_causal_lm(config.actor_rollout_ref.model).eval()
    reference = transformers_log_probs(config.actor_rollout_ref.model.path, batch, all_images)
    response_mask = batch.batch["response_mask"].bool()
    padded = trainer_log_probs(model, batch, packed=False)
    packed = trainer_log_probs(enable_packing(copy.deepcopy(model)), batch, packed=True)
    for ours in (padded, packed):
        gap = (ours - reference)[response_mask].abs().max()
        assert gap < 1e-5, gap
    rollout_gap = (batch.batch["rollout_log_probs"] - padded)[response_mask].abs().max()
    # the server (another process, its own threads) generated each turn with the same images: fp32 sums
    # in another order differ by ~1e-5; a missing or wrong image moves them by > 1e-2
    assert rollout_gap < 1e-4, rollout_gap

    # the tokens after the tool's picture depend on its pixels; the ones before do not
    blank = copy.deepcopy(batch)
    for column in blank.non_tensor_batch[MULTI_MODAL_INPUTS]:
        column["pixel_values"][16:] = 0  # the prompt's picture is 16 patches, the tool's follow
    responses = batch.batch["responses"][0, :n]
    block = (responses == processor.image_token_id).nonzero()[:, 0]  # the tool's image tokens
    moved = (trainer_log_probs(model, blank, packed=False) - padded)[:, :n].abs()
    assert moved[:, : int(block.min()) + 1].max() < 1e-6  # predicted from the tokens before the picture
    assert moved[:, int(block.max()) + 1 :].max() > 1e-2  # the tool's text and the answer, after it


@pytest.mark.usefixtures("ray_session")
def test_the_ray_trainers_actor_sees_the_tool_images_of_a_sampled_batch(tmp_path):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    write_rows(tmp_path / "rows.parquet", 4)
    overrides = {
        "data.train_files": str(tmp_path / "rows.parquet"),
        "data.val_files": str(tmp_path / "rows.parquet"),
        "data.train_batch_size": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.rollout.n": 2,
        "algorithm.adv_estimator": "grpo",
        "trainer.default_local_dir": str(tmp_path / "checkpoints"),
        "trainer.logger": "[]",
    }
    agent = agent_overrides(cached_tool_vlm(), tmp_path / "tools.yaml", max_prompt_length=16)
    config = load_config(agent + [f"{key}={value}" for key, value in overrides.items()])
    trainer = RayPPOTrainer(config)
    try:
        trainer.init_workers()
        batch = trainer._repeat_prompts(next(trainer._batches()).batch)
        trainer.global_steps = 1
        batch = trainer._generate(batch, {})  # sampled, seeded by the step
        actor = trainer.actor_rollout_wg.compute_log_prob(batch).batch["old_log_probs"]
    finally:
        trainer.close()
    columns = batch.non_tensor_batch[MULTI_MODAL_INPUTS]
    turns = batch.non_tensor_batch["__num_turns__"]  # user + model turns + tool turns
    assert [len(c["image_grid_thw"]) for c in columns] == [1 + int(n == 4) for n in turns]
    assert any(n == 4 for n in turns)  # some trajectories called the tool and got its picture
    vision = micro_batch_vision(columns)
    reference = transformers_log_probs(config.actor_rollout_ref.model.path, batch, vision)
    mask = batch.batch["response_mask"].bool()
    # the actor's worker sums in fp32 with its own thread count: 1.0014e-05 seen on a busy machine; a
    # missing or wrong image moves them by > 1e-2
    assert (actor - reference)[mask].abs().max() < 1e-4
    # the rollout decoded token by token with a KV cache, the actor in one forward: fp32 sums in another
    # order differ by up to ~1.1e-5 (seen under load); a missing or wrong image moves them by > 1e-2
    assert (batch.batch["rollout_log_probs"] - actor)[mask].abs().max() < 1e-4


def test_a_text_policy_given_a_tool_image_is_an_error_naming_the_tool(tmp_path):
    from tests.experimental.agent_loop.conftest import run
    from tests.experimental.agent_loop.tool_model import cached_tool_model

    # the memorised text model calls `calculator` on Q1; here that name answers with a picture
    tools = tmp_path / "tools.yaml"
    config = agent_config(cached_tool_model(), tools, max_prompt_length=8)
    tools.write_text(
        TOOLS_YAML.replace(
            "config: {}", "config: {}\n    tool_schema: {type: function, function: {name: calculator}}"
        )
    )
    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path)
    server, front, manager = serve(config, tokenizer)
    try:
        with pytest.raises(ValueError, match=r"the tool 'calculator' returned 1 image\(s\).*text-only"):
            run(manager, tokenizer, ["Q1"])
    finally:
        manager.close()
        front.close()
        server.close()


def test_a_tool_response_takes_its_images_as_a_list():
    image = tool_image()
    assert ToolResponse(text="x", image=[image]).image == [image]
    with pytest.raises(TypeError, match=r"ToolResponse.image must be a list.*\[image\]"):
        ToolResponse(image=image)


@pytest.mark.parametrize("engine", ["vllm_engine.VLLMStepEngine", "sglang_engine.SGLangStepEngine"])
def test_engines_without_image_inputs_refuse_a_request_with_images(engine):
    """The vLLM and SGLang servers get no images here: a request that carries some is refused by name."""
    import importlib
    from types import SimpleNamespace

    from verl.workers.rollout.http_front import BadRequest, HTTPFront
    from verl.workers.vision import encode_images

    module, name = engine.split(".")
    cls = getattr(importlib.import_module(f"verl.workers.rollout.{module}"), name)
    front = SimpleNamespace(server=SimpleNamespace(engine=object.__new__(cls)))
    images = encode_images(
        {"pixel_values": torch.zeros(16, 1176), "image_grid_thw": torch.tensor([[1, 4, 4]])}
    )
    with pytest.raises(
        BadRequest, match=rf"multi_modal_inputs: this rollout engine \({name}\) takes no images"
    ):
        HTTPFront._images(front, {"multi_modal_inputs": images})
    assert HTTPFront._images(front, {}) is None  # text requests go on as before
