"""Record every leaf key of verl's PPO configs with its default, for ``verl/config/verl091_keys.json``
(verl 0.9.1's release) and ``verl/config/verl_head_keys.json`` (verl's repository at a commit).

verl is not a dependency: install it once in a side environment (or unpack its wheel) and point
this script at its generated trainer YAML::

    pip download --no-deps verl==0.9.1 -d /tmp/verl && unzip -q /tmp/verl/verl-0.9.1-*.whl -d /tmp/verl
    python tests/trainer/config/verl_reference/record_verl_keys.py \
        /tmp/verl/verl/trainer/config/_generated_ppo_trainer.yaml verl/config/verl091_keys.json

or, from a fetched copy of verl's repository, at both generated configs (FSDP and Megatron; a key in
both keeps the first one's default)::

    for f in _generated_ppo_trainer.yaml _generated_ppo_megatron_trainer.yaml; do
        git -C VERL_REPO show HEAD:verl/trainer/config/$f > /tmp/$f; done
    python tests/trainer/config/verl_reference/record_verl_keys.py \
        /tmp/_generated_ppo_trainer.yaml /tmp/_generated_ppo_megatron_trainer.yaml verl/config/verl_head_keys.json

Defaults are recorded as written (interpolations stay strings); ``_target_`` entries (verl's
dataclass names) are left out.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def leaves(node: DictConfig, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in node.keys():
        if key == "_target_":
            continue
        child = node._get_node(key)
        full = f"{prefix}{key}"
        if isinstance(child, DictConfig) and len(child) > 0:
            out.update(leaves(child, full + "."))
        elif isinstance(child, (DictConfig, ListConfig)):
            out[full] = OmegaConf.to_container(child, resolve=False)
        else:
            out[full] = child._value()
    return out


def main(yaml_paths: list[str], out_path: str) -> None:
    keys: dict[str, Any] = {}
    for path in yaml_paths:
        keys = {**leaves(OmegaConf.load(path)), **keys}
    folder = os.path.dirname(os.path.abspath(out_path))
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as tmp:
        json.dump(dict(sorted(keys.items())), tmp, indent=0, sort_keys=True)
        tmp.write("\n")
    os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, out_path)  # never a half-written table
    print(f"{len(keys)} keys -> {out_path}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: record_verl_keys.py VERL_GENERATED_TRAINER_YAML [MORE_YAML ...] OUT_JSON")
    main(sys.argv[1:-1], sys.argv[-1])
