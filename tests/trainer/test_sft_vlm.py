"""The SFT trainer on chats with images (verl's multimodal SFT rows: ``<image>`` in the messages,
an ``images`` column) and a freshly initialised tiny Qwen2-VL: its first step's loss is transformers'
own Qwen2-VL forward on the same rows (positions from ``mm_token_type_ids``), padded and packed; a
few steps lower the validation loss; the exported checkpoint holds the image processor and loads as
an image-text-to-text model with the trained weights; a text-only model refuses the image column."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from verl.builtin import vision_task
from verl.config.sft_trainer import load_sft_config
from verl.model_merger.fsdp import merge_fsdp_checkpoint
from verl.trainer.sft_trainer import SFTTrainer
from verl.utils.dataset.schema import DatasetError
from verl.utils.dataset.vision import VisionProcessor, image_messages, load_image

STEPS = 6
BATCH = 16


def digit_chats(num_rows: int, split: str) -> list[dict]:
    """The built-in digit task as SFT chats: user ``<image>=``, assistant the digit. Rows differ in
    length (so micro-batches hold pads): every third image is enlarged to 112x112 (16 image tokens,
    not 4), every fourth row is text only (``7=`` -> ``7``)."""
    chats = []
    for i, row in enumerate(vision_task.make_vision_rows(num_rows, seed=7, split=split)):
        digit = row["reward_model"]["ground_truth"]
        images = [{"bytes": enlarged(row["images"][0]["bytes"])}] if i % 3 == 2 else row["images"]
        prompt = "<image>="
        if i % 4 == 3:
            prompt, images = f"{digit}=", []
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": digit}]
        chats.append({"messages": messages, "images": images})
    return chats


def enlarged(png: bytes) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.open(io.BytesIO(png)).resize((112, 112)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_rows(rows: list[dict], path: Path) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.fixture(scope="module")
def vlm_files(tmp_path_factory) -> dict[str, str]:
    """A fresh tiny Qwen2-VL folder (weights, tokenizer, image processor) and train/val chats."""
    folder = tmp_path_factory.mktemp("sft_vlm")
    tokenizer = vision_task.build_vision_tokenizer()
    vision_task.build_tiny_qwen2_vl(tokenizer, seed=0).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    vision_task.build_image_processor().save_pretrained(folder / "model")
    return {
        "model": str(folder / "model"),
        "train": write_rows(digit_chats(BATCH * STEPS, "train"), folder / "train.parquet"),
        "val": write_rows(digit_chats(32, "val"), folder / "val.parquet"),
    }


def vlm_config(tmp_path: Path, files: dict[str, str], *overrides: str):
    return load_sft_config(
        [
            f"model.path={files['model']}",
            f"data.train_files={files['train']}",
            f"data.val_files={files['val']}",
            f"data.train_batch_size={BATCH}",
            "data.max_length=32",
            "data.max_token_len_per_gpu=48",  # a few rows per micro-batch
            "data.shuffle=False",
            "optim.lr=3e-3",
            "optim.weight_decay=0.0",
            f"trainer.total_training_steps={STEPS}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "trainer.device=cpu",
            "trainer.logger=[]",
            "checkpoint.save_contents=[model,optimizer,extra,hf_model]",
            *overrides,
        ]
    )


def transformers_loss(model, tokenizer, processor: VisionProcessor, rows: list[dict]) -> float:
    """Mean cross-entropy of the assistant's tokens (the digit and the template's ``<eos>``) from
    Qwen2-VL's own forward of the right-padded rows: its M-RoPE positions from ``mm_token_type_ids``."""
    ids, targets, pixels, grids = [], [], [], []
    for row in rows:
        messages = image_messages(row["messages"], len(row["images"]), "test")
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        if row["images"]:
            vision = processor.images([load_image(image, "test") for image in row["images"]])
            text = processor.expand(text, vision["image_grid_thw"])
            pixels.append(vision["pixel_values"])
            grids.append(vision["image_grid_thw"])
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        targets.append(len(tokenizer(row["messages"][1]["content"])["input_ids"]) + 1)  # + <eos>
    width = max(len(seq) for seq in ids)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (seq, n) in enumerate(zip(ids, targets)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(seq) - n : len(seq)] = torch.tensor(seq[-n:])
    mask = (torch.arange(width) < torch.tensor([len(seq) for seq in ids])[:, None]).long()
    with torch.no_grad():
        logits = model(
            input_ids=input_ids,
            attention_mask=mask,
            mm_token_type_ids=(input_ids == processor.image_token_id).int(),
            pixel_values=torch.cat(pixels),
            image_grid_thw=torch.cat(grids),
        ).logits
    return float(
        F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
    )


def reference(files: dict[str, str]):
    """The model folder as transformers alone loads it, with its tokenizer and image processor."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(files["model"])
    model = AutoModelForImageTextToText.from_pretrained(files["model"], dtype=torch.float32).eval()
    image_processor = AutoImageProcessor.from_pretrained(files["model"])
    processor = VisionProcessor(image_processor, "<|image_pad|>", model.config.image_token_id, 2)
    return model, tokenizer, processor


def rows_of(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_sft_on_image_chats_matches_transformers_and_lowers_the_validation_loss(tmp_path, vlm_files):
    model, tokenizer, processor = reference(vlm_files)
    expected = transformers_loss(model, tokenizer, processor, rows_of(vlm_files["train"])[:BATCH])
    trainer = SFTTrainer(vlm_config(tmp_path, vlm_files))
    try:
        batch = next(trainer._batches())
        assert batch[0]["position_ids"].shape[0] == 3  # M-RoPE positions, built by the dataset
        before = trainer.validate()["val/loss"]
        losses = [trainer.train_step(batch)["train/loss"]]
        losses += [trainer.train_step(next(trainer._batches()))["train/loss"] for _ in range(STEPS - 1)]
        after = trainer.validate()["val/loss"]
        trainer.global_step = STEPS
        trainer.save_checkpoint()
    finally:
        trainer.close()
    assert losses[0] == pytest.approx(expected, abs=1e-5)
    assert after < 0.8 * before, (before, after, losses)
    # the export: the image processor's files go with the weights, and transformers alone loads the
    # trained model (its validation loss is the trainer's)
    exported = tmp_path / "ckpt" / f"global_step_{STEPS}" / "model" / "huggingface"
    assert (exported / "preprocessor_config.json").is_file()
    loaded = reference({"model": str(exported)})
    assert transformers_loss(*loaded, rows_of(vlm_files["val"])) == pytest.approx(after, abs=1e-5)
    merged = merge_fsdp_checkpoint(str(exported.parent), str(tmp_path / "merged"))
    assert (Path(merged) / "preprocessor_config.json").is_file()
    assert transformers_loss(*reference({"model": merged}), rows_of(vlm_files["val"])) == pytest.approx(
        after, abs=1e-5
    )


def test_the_packed_path_gives_the_same_first_step(tmp_path, vlm_files):
    model, tokenizer, processor = reference(vlm_files)
    expected = transformers_loss(model, tokenizer, processor, rows_of(vlm_files["train"])[:BATCH])
    trainer = SFTTrainer(vlm_config(tmp_path, vlm_files, "model.use_remove_padding=True"))
    try:
        assert trainer.packed
        loss = trainer.train_step(next(trainer._batches()))["train/loss"]
    finally:
        trainer.close()
    assert loss == pytest.approx(expected, abs=1e-5)


def test_a_text_only_model_refuses_the_image_column(tmp_path, vlm_files):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = vision_task.build_vision_tokenizer()
    text_model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    text_model.save_pretrained(tmp_path / "text")
    tokenizer.save_pretrained(tmp_path / "text")
    config = vlm_config(tmp_path, {**vlm_files, "model": str(tmp_path / "text")})
    with pytest.raises(DatasetError, match=r"train\.parquet, row 0, column 'images'.*text-only"):
        SFTTrainer(config)


def test_bad_image_rows_name_the_row_and_column(tmp_path, vlm_files):
    from transformers import AutoTokenizer

    from verl.utils.dataset.sft_dataset import SFTDataset
    from verl.utils.dataset.vision import load_vision_processor

    tokenizer = AutoTokenizer.from_pretrained(vlm_files["model"])
    processor = load_vision_processor(vlm_files["model"], tokenizer)
    good = digit_chats(3, "bad")[2]  # an enlarged image: 16 image tokens
    rows = [
        {**good, "messages": [{"role": "user", "content": "<image><image>="}, good["messages"][1]]},
        good,
    ]
    config = load_sft_config(["data.max_length=12", "data.truncation=left"]).data
    data = SFTDataset(write_rows(rows, tmp_path / "bad.parquet"), tokenizer, config, processor=processor)
    with pytest.raises(
        DatasetError, match=r"row 0, column 'messages'.*2 <image> placeholder\(s\) but the row has 1"
    ):
        data[0]
    with pytest.raises(DatasetError, match=r"row 1: the chat is 21 tokens.*never cut"):
        data[1]
    videos = write_rows([{**good, "videos": [{"path": "clip.mp4"}]}], tmp_path / "videos.parquet")
    with pytest.raises(DatasetError, match=r"videos\.parquet, row 0, column 'videos'"):
        SFTDataset(videos, tokenizer, config, processor=processor)
