import dataclasses

import pytest
from omegaconf import OmegaConf

from verl.config.base import ConfigError
from verl.config.data import DataConfig


def test_defaults_match_verl():
    cfg = DataConfig()
    assert cfg.prompt_key == "prompt" and cfg.reward_fn_key == "data_source"
    assert (cfg.max_prompt_length, cfg.max_response_length, cfg.train_batch_size) == (512, 512, 1024)
    assert cfg.truncation == "error" and cfg.shuffle is True and cfg.seed is None
    assert cfg.filter_overlong_prompts is False and cfg.return_raw_chat is False
    assert cfg.val_batch_size is None and cfg.dataloader_num_workers == 8
    cfg.validate("data")


def test_omegaconf_compatible_with_list_files():
    cfg = OmegaConf.structured(DataConfig)
    cfg.train_files = ["a.parquet", "b.parquet"]
    obj = OmegaConf.to_object(cfg)
    assert list(obj.train_files) == ["a.parquet", "b.parquet"]
    obj.validate("data")


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"truncation": "cut"}, "data.truncation"),
        ({"max_prompt_length": 0}, "data.max_prompt_length"),
        ({"train_batch_size": -1}, "data.train_batch_size"),
        ({"val_batch_size": 0}, "data.val_batch_size"),
        ({"train_max_samples": 0}, "data.train_max_samples"),
        ({"train_files": []}, "data.train_files"),
        ({"prompt_key": ""}, "data.prompt_key"),
    ],
)
def test_validate_names_the_key(change, key):
    with pytest.raises(ConfigError, match=f"^{key}: expected"):
        dataclasses.replace(DataConfig(), **change).validate("data")


def test_custom_cls_needs_a_name():
    cfg = DataConfig()
    cfg.custom_cls.path = "x.py"
    with pytest.raises(ConfigError, match=r"data.custom_cls.name"):
        cfg.validate("data")


def test_every_field_has_a_doc_string():
    import ast
    import inspect

    from verl.config import data

    tree = ast.parse(inspect.getsource(data))
    for node in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), stmt.target.id
