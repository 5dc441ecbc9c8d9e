"""``python -m verl.config.write_generated``: rewrite ``verl/trainer/config/generated/ppo_trainer.yaml``, the
schema's defaults as the YAML plain Hydra composes (:mod:`verl.config.hydra_schema`). Run it after a
default in ``verl/config/*.py`` changes; ``tests/trainer/config/test_plain_hydra.py`` checks the file
is current."""

from __future__ import annotations

from pathlib import Path

from verl.config.hydra_schema import GENERATED_GROUP, write_generated
from verl.config.ppo_trainer import CONFIG_DIR, PPOTrainerConfig

GENERATED_PPO_TRAINER = Path(CONFIG_DIR) / GENERATED_GROUP / "ppo_trainer.yaml"


def main() -> None:
    write_generated(PPOTrainerConfig, GENERATED_PPO_TRAINER)
    print(f"wrote {GENERATED_PPO_TRAINER}")


if __name__ == "__main__":
    main()
