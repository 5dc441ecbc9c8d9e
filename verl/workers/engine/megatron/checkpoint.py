"""The Megatron engine's checkpoints: one file per rank (``megatron_rank_<r>.pt``) with its shard,
its optimizer state (the distributed optimizer's shards included), the LR step and its place in the
layout, which ``python -m verl.model_merger merge --backend megatron`` reads. Resuming needs the same
ranks and parallel sizes, and is exact."""

from __future__ import annotations

import os

import torch

from verl.utils.checkpoint_io import torch_load
from verl.workers.engine.optim import lr_multiplier


class ShardedCheckpoint:
    """Save and load for :class:`~verl.workers.engine.megatron.engine.MegatronEngine` (a mixin: it
    reads the engine's ``rank``, ``optimizer``, ``lr_step``, ``optim_config``, ``_bare_model()`` and
    ``_set_lr()``)."""

    def layout(self) -> dict[str, int]:
        """Where this rank's shard sits (what ``python -m verl.model_merger merge --backend megatron``
        reassembles the model from)."""
        from megatron.core import parallel_state as ps

        return {
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "tp_size": ps.get_tensor_model_parallel_world_size(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "pp_size": ps.get_pipeline_model_parallel_world_size(),
            "dp_rank": ps.get_data_parallel_rank(),
            "ep_rank": ps.get_expert_model_parallel_rank(),
            "ep_size": ps.get_expert_model_parallel_world_size(),
            "etp_rank": ps.get_expert_tensor_parallel_rank(),
            "etp_size": ps.get_expert_tensor_parallel_world_size(),
        }

    def _check_layout(self, path: str, saved: dict) -> None:
        """The same place in the same layout as the rank that wrote ``path`` (checkpoints of earlier
        versions lack the expert entries: those must be 1 and rank 0 here)."""
        here = self.layout()
        defaults = {"ep_rank": 0, "ep_size": 1, "etp_rank": 0, "etp_size": 1}
        differ = {
            k: (saved.get(k, defaults.get(k)), v)
            for k, v in here.items()
            if saved.get(k, defaults.get(k)) != v
        }
        if differ:
            named = ", ".join(f"{k} saved {a}, here {b}" for k, (a, b) in differ.items())
            raise ValueError(
                f"{path} was written by another layout ({named}); exact resume needs the same ranks and "
                "parallel sizes (merge it with python -m verl.model_merger to start from its weights)"
            )

    def _shard_file(self, folder: str) -> str:
        return os.path.join(folder, f"megatron_rank_{self.rank}.pt")

    def _distributed_parts(self) -> list:
        """The optimizer's distributed parts (``use_distributed_optimizer``): their state lives outside
        ``state_dict()``; a plain megatron optimizer's does not."""
        parts = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        return [part for part in parts if hasattr(part, "get_parameter_state_dp_reshardable")]

    def save(self, folder: str, contents: list[str]) -> None:
        state: dict = {"lr_step": self.lr_step, "layout": self.layout()}
        if "model" in contents:
            state["model"] = self._bare_model().state_dict()
        if "optimizer" in contents and self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
            # The distributed optimizer's state_dict() leaves out the fp32 main weights and Adam's
            # moments; each part (megatron wraps it in a ChainedOptimizer) gives its own shard of them.
            state["optimizer_shards"] = []
            for part in self._distributed_parts():
                shards = part.get_parameter_state_dp_reshardable()
                buffers = [by_dtype for key, by_dtype in shards.items() if isinstance(key, int)]
                entries = [e for b in buffers for buckets in b.values() for bucket in buckets for e in bucket]
                for entry in entries:  # what the load expects of each: none is padding
                    entry["padding"] = False
                state["optimizer_shards"].append(shards)
        path = self._shard_file(folder)
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)

    def load(self, folder: str, contents: list[str]) -> None:
        path = self._shard_file(folder)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} is missing: the checkpoint was written by another layout or rank count; exact resume "
                "needs the same ranks and parallel sizes"
            )
        state = torch_load(path)
        self._check_layout(path, state.get("layout", {}))
        if "model" in contents and "model" in state:
            self._bare_model().load_state_dict(state["model"])
        if "optimizer" in contents and "optimizer" in state and self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            for part, shards in zip(
                self._distributed_parts(), state.get("optimizer_shards", []), strict=True
            ):
                with torch.no_grad():  # the fp32 main weights are views of the model's parameters
                    part.load_parameter_state_from_dp_reshardable(shards)
                # megatron's load_state_dict hands every parameter one shared Adam 'step' tensor, which
                # torch's Adam would then advance once per parameter: one each, as before the save
                for param_state in part.optimizer.state.values():
                    if "step" in param_state:
                        param_state["step"] = param_state["step"].clone()
        if "extra" in contents:
            self.lr_step = state["lr_step"]
            if self.optimizer is not None:
                self._set_lr(self.optim_config.lr * lr_multiplier(self.lr_step, self.optim_config))
