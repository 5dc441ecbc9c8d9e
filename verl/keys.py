"""Every key that travels in a :class:`verl.protocol.DataProto` through the PPO dataflow.

Code reads and writes these keys as plain strings (``batch["responses"]``), as verl users
expect; this module is where each one is named and explained. A test scans the package
and fails when code uses a batch key that is not listed here.

Shapes: ``B`` is the number of rows (prompts x ``rollout.n``), ``P`` the prompt length
(left-padded), ``R`` the response length (right-padded), ``L = P + R``.
"""

# Tensors in ``DataProto.batch``.
BATCH_KEYS: dict[str, str] = {
    "input_ids": "[B, L] (or [B, P] before generation) token ids, prompt left-padded, response right-padded",
    "attention_mask": "[B, L] 1 on real tokens, 0 on padding",
    "position_ids": "[B, L] positions counted over real tokens only (0 on left padding); [B, 3, L] M-RoPE positions for a vision-language model",
    "prompts": "[B, P] the left-padded prompt ids",
    "responses": "[B, R] the generated ids, right-padded",
    "response_mask": "[B, R] 1 on generated tokens up to and including EOS, 0 after",
    "rollout_log_probs": "[B, R] log-probs of the sampled tokens under the rollout engine (behaviour policy)",
    "rollout_is_weights": "[B, R] detached rollout importance weights (algorithm.rollout_correction.rollout_is), 0 on padding",
    "sum_pi_squared": "[B, R] sum over the vocabulary of pi^2 at each response token (optimal-token-baseline estimators)",
    "old_log_probs": "[B, R] log-probs recomputed by the actor before the update (PPO's pi_old)",
    "ref_log_prob": "[B, R] log-probs under the frozen reference policy",
    "teacher_log_probs": "[B, R] log-probs of the sampled tokens under a distillation teacher (at temperature 1)",
    "teacher_topk_log_probs": "[B, R, k] the teacher's top-k log-probs at each response position (forward_kl_topk)",
    "teacher_topk_ids": "[B, R, k] the token ids of those top-k log-probs",
    "entropys": "[B, R] per-token entropy of the actor's distribution when old log-probs were computed",
    "values": "[B, R] critic values V(s_t) for each response token",
    "token_level_scores": "[B, R] reward from the reward function/model, at the last response token",
    "token_level_rewards": "[B, R] scores minus the in-reward KL penalty (equal to scores without it)",
    "advantages": "[B, R] advantage estimates (losses mask padding; GAE leaves padding non-zero, as verl)",
    "returns": "[B, R] value targets (advantages + values for GAE)",
    "reward_baselines": "[B] reward of a greedy response to the same prompt (ReMax baseline)",
    "rm_scores": "[B, R] the reward model's score on each response's last token, zeros elsewhere",
    "rm_truncated": "[B] 1.0 where the reward model read a conversation cut to reward_model.max_length",
    "response_versions": "[B, R] policy version that generated each response token (async training)",
    "policy_version": "[B] policy version at the start of generation of each row",
    "acc": "[B] the scores PrimeRewardManager also stores in the batch (verl's)",
    "loss_mask": "[B, L] SFT only: 1 on the assistant's tokens (the targets), 0 elsewhere; sequences right-padded",
}

# Columns in ``DataProto.non_tensor_batch`` (1-D numpy object arrays).
NON_TENSOR_KEYS: dict[str, str] = {
    "uid": "id shared by the n responses sampled from one prompt (groups for GRPO/RLOO/...)",
    "data_source": "name of the dataset a row comes from; picks the reward scorer",
    "reward_model": "dict with 'style' and 'ground_truth' from the dataset row",
    "extra_info": "dict of extra dataset fields (split, index, ...) passed to the scorer",
    "ability": "task category from the dataset row (math, arithmetic, ...)",
    "raw_prompt": "the chat messages of the prompt (when data.return_raw_chat=True)",
    "raw_prompt_ids": "list of prompt token ids without padding (for server rollouts)",
    "full_prompts": "the prompt text after the chat template (when data.return_full_prompt=True)",
    "index": "row index inside its dataset split",
    "multi_modal_inputs": "dict per row of a vision-language model's image inputs: pixel_values [patches, C], image_grid_thw [images, 3] (empty without images), in the order of the row's image blocks (an agent loop's tools' images follow the prompt's)",
    "tool_rewards": "list per row of an agent loop's tool rewards (each call's step reward, then each tool's calc_reward)",
    "turn_scores": "list per row of the scores an interaction (simulated user) gave the trajectory's answers, in order",
    "acc": "1.0/0.0 per row: the scorer's verdict (when the scorer reports it, as reward_extra_info)",
}

# Entries of ``DataProto.meta_info`` (not split along the batch).
META_KEYS: dict[str, str] = {
    "eos_token_id": "id(s) that end a response",
    "pad_token_id": "id used for padding",
    "do_sample": "False for greedy decoding (validation)",
    "validate": "True when generating for validation",
    "temperature": "sampling temperature used for generation and for log-prob recomputation",
    "top_p": "nucleus sampling mass for this generation call (overrides the config)",
    "top_k": "top-k for this generation call (overrides the config)",
    "response_length": "maximum generated tokens for this generation call (overrides the config)",
    "global_steps": "the trainer's step counter",
    "sampling_seed": "reseeds the rollout sampler for this request (the trainers pass the step, so a replayed step samples the same tokens)",
    "weight_version": "the policy version a batch must be generated with, whole (async trainer with async_training.partial_rollout=False)",
    "global_token_num": "list of non-padding token counts per row (for throughput metrics)",
    "metrics": "dict of metrics a worker returns alongside its output; DataProto.concat gathers the parts' (a worker group's ranks') into one list per key, which the driver reduces (verl.utils.metric.reduce_metrics)",
    "timing": "dict of phase timings a worker returns alongside its output (verl's; the workers here report timings under metrics: DataProto.concat refuses a non-metric key whose value differs between ranks)",
    "micro_batch_size": "rows per forward pass on one rank",
    "max_token_len": "token budget per micro-batch when use_dynamic_bsz=True",
    "use_dynamic_bsz": "whether to group micro-batches by token count",
    "policy_version": "version of the weights that served a request",
    "proximal_weights": "True when compute_log_prob should use the weights kept at the last sync (async compute_prox_log_prob)",
    "reward_extra_keys": "names of the non-tensor columns a reward manager reports as reward_extra_info (verl's AbstractRewardManager)",
    "rollout_corr_metrics": "dict of rollout_corr/* metrics written by compute_advantage (algorithm.rollout_correction)",
}
