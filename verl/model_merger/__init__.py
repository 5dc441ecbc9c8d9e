"""Turn a training checkpoint into a Hugging Face model directory.

    python -m verl.model_merger merge --backend fsdp \\
        --local_dir checkpoints/<project>/<experiment>/global_step_N/actor --target_dir ./hf_model

``--backend megatron`` for a checkpoint of the Megatron engine (``megatron_rank_*.pt``). See
:mod:`verl.model_merger.fsdp` and :mod:`verl.model_merger.megatron`.
"""

from verl.model_merger.fsdp import merge_fsdp_checkpoint
from verl.model_merger.megatron import merge_megatron_checkpoint

__all__ = ["merge_fsdp_checkpoint", "merge_megatron_checkpoint"]
