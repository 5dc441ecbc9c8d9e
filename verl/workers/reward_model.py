"""``RewardModelWorker``: a discriminative reward model scoring responses (``compute_rm_score``).

Per row: the policy's response is decoded with the policy tokenizer (special tokens skipped),
appended to the prompt's chat messages (``raw_prompt``) as an assistant turn, rendered with the
reward model's own tokenizer and chat template, and scored; the score is the model's one-label
head at the conversation's last token. It lands on the response's last valid token of
``rm_scores`` ``[B, R]`` (zeros elsewhere), where the reward managers read it.

Conversations are left-padded per micro-batch (``micro_batch_size_per_gpu`` rows, or a token
budget with ``use_dynamic_bsz``), so the last position of every row is its last token.
"""

from __future__ import annotations

import numpy as np
import torch

from verl.config.reward import RewardModelConfig
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.utils.model import TokenizerSource, load_reward_model, load_tokenizer, load_tokenizer_from
from verl.utils.reward_inputs import RM_INPUT_KEYS, last_token_scores, left_padded, render_conversation
from verl.workers.engine.fsdp import FSDPEngine
from verl.workers.engine.micro_batch import restore_order, split_micro_batches


class RewardModelWorker(Worker):
    def __init__(
        self, config: RewardModelConfig, policy_tokenizer: TokenizerSource, nccl_timeout_s: float = 600.0
    ) -> None:
        """``policy_tokenizer``: what the driver tokenized prompts with (decodes the responses unless
        ``model.input_tokenizer`` names another)."""
        super().__init__()
        self.config = config
        self.policy_tokenizer_source = policy_tokenizer
        self.nccl_timeout_s = nccl_timeout_s
        self.engine: FSDPEngine | None = None

    def process_reusable(self) -> bool:
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_process_group(self.nccl_timeout_s)
        model = self.config.model
        if model.input_tokenizer:
            self.policy_tokenizer = load_tokenizer(
                model.input_tokenizer, model.trust_remote_code, key="reward_model.model.input_tokenizer"
            )
        else:
            self.policy_tokenizer = load_tokenizer_from(self.policy_tokenizer_source)
        self.tokenizer = load_tokenizer(model.path, model.trust_remote_code, key="reward_model.model.path")
        self.engine = FSDPEngine(load_reward_model(model), self.device, model.fsdp_config)

    def conversations(self, data: DataProto) -> tuple[list[list[int]], torch.Tensor, list[bool]]:
        """Each row's re-templated token ids, its response length, and whether it was truncated."""
        prompt_len = data.batch["prompts"].shape[-1]
        lengths = data.batch["attention_mask"][:, prompt_len:].sum(-1).long()
        responses = data.batch["responses"]
        texts = self.policy_tokenizer.batch_decode(
            [responses[i, : int(n)].tolist() for i, n in enumerate(lengths)], skip_special_tokens=True
        )
        limit = self.config.max_length
        rows, truncated = [], []
        for messages, text in zip(data.non_tensor_batch["raw_prompt"], texts):
            ids = self.tokenizer(
                render_conversation(self.tokenizer, list(messages), text), add_special_tokens=False
            )["input_ids"]
            truncated.append(limit is not None and len(ids) > limit)
            rows.append(ids[-limit:] if truncated[-1] else ids)
        return rows, lengths, truncated

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` ``[B, R]`` (the score on each response's last token) and ``rm_truncated`` ``[B]``."""
        cfg = self.config
        rows, lengths, truncated = self.conversations(data)
        inputs = DataProto.from_dict(left_padded(rows, self.tokenizer.pad_token_id))
        micro_batches, groups = split_micro_batches(
            inputs,
            RM_INPUT_KEYS,
            cfg.micro_batch_size_per_gpu,
            cfg.use_dynamic_bsz,
            cfg.forward_max_token_len_per_gpu,
        )
        outs = self.engine.infer(micro_batches, last_token_scores)
        scores = restore_order([o["scores"] for o in outs], groups)
        rm_scores = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        rm_scores[torch.arange(len(data)), (lengths - 1).clamp(min=0)] = scores
        flags = torch.as_tensor(np.array(truncated, dtype=np.float32))
        return DataProto.from_dict({"rm_scores": rm_scores, "rm_truncated": flags})
