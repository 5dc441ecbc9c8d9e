"""Turn a training checkpoint into a Hugging Face model directory.

    python -m verl.model_merger merge --backend fsdp \\
        --local_dir checkpoints/<project>/<experiment>/global_step_N/actor --target_dir ./hf_model

See :mod:`verl.model_merger.fsdp`.
"""

from verl.model_merger.fsdp import merge_fsdp_checkpoint

__all__ = ["merge_fsdp_checkpoint"]
