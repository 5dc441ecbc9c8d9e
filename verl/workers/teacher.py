"""``TeacherWorker``: a frozen teacher that scores the student's samples (on-policy distillation).

A teacher is the reference role over another model: the same engines (FSDP or Megatron, the
reference's ``actor_rollout_ref.ref.*`` settings), micro-batching and packing, on the teachers' own
pool (``distillation.nnodes x n_gpus_per_node``). It scores at temperature 1, as verl's teacher
(its prompt log-probs do not depend on the sampling temperature), and returns either the sampled
tokens' log-probs or, for ``forward_kl_topk``, its ``topk`` most likely tokens at each position.
"""

from __future__ import annotations

import copy

from verl.config.actor import ActorRolloutRefConfig
from verl.protocol import DataProto
from verl.single_controller import Dispatch, register
from verl.utils.model import TokenizerSource
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

TEACHER_TEMPERATURE = 1.0


class TeacherWorker(ActorRolloutRefWorker):
    def __init__(
        self, config: ActorRolloutRefConfig, topk: int | None = None, tokenizer: TokenizerSource | None = None
    ) -> None:
        """``config``: the policy's section with the teacher's model (:func:`teacher_config`);
        ``topk``: return the top-k tokens (forward_kl_topk) instead of the sampled tokens' log-probs."""
        super().__init__(config, role="ref", tokenizer=tokenizer)
        self.topk = topk

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """``teacher_log_probs`` ``[B, R]``, or ``teacher_topk_log_probs`` and ``teacher_topk_ids``
        ``[B, R, k]``, of the responses under the teacher."""
        cfg = self.config.ref
        data.meta_info["temperature"] = TEACHER_TEMPERATURE
        out = self._log_probs(
            self.ref,
            data,
            cfg.log_prob_micro_batch_size_per_gpu,
            cfg.log_prob_use_dynamic_bsz,
            cfg.log_prob_max_token_len_per_gpu,
            False,
            topk=self.topk,
        )
        if self.topk is None:
            return DataProto.from_dict({"teacher_log_probs": out["log_probs"]})
        return DataProto.from_dict(
            {"teacher_topk_log_probs": out["topk_log_probs"], "teacher_topk_ids": out["topk_ids"]}
        )


def teacher_config(policy: ActorRolloutRefConfig, model_path: str) -> ActorRolloutRefConfig:
    """The policy's section, serving ``model_path`` as a reference: no adapters, no sequence parallelism
    (the teachers' pool need not match the actor's groups)."""
    config = copy.deepcopy(policy)
    config.model.path = model_path
    config.model.lora_rank, config.model.lora_adapter_path = 0, None
    config.actor.ulysses_sequence_parallel_size = 1
    return config
