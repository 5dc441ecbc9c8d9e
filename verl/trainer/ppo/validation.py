"""Validation: generate for every validation prompt (``val_kwargs``), score, summarise.

Metrics follow verl: ``val-core/<data_source>/<acc|reward>/mean@<n>`` (plus best@/maj@
when ``val_kwargs.n > 1``) and ``val-aux/...`` for the rest.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.config.ppo_trainer import PPOTrainerConfig
from verl.protocol import DataProto
from verl.trainer.ppo.generation_dump import ground_truths, write_generations
from verl.trainer.ppo.prompts import attach_responses, pop_prompts, repeat_prompts
from verl.trainer.ppo.val_metrics import flatten_validation_metrics, process_validation_metrics
from verl.utils.tracking import select_generations
from verl.workers.rollout.client import RolloutClient

logger = logging.getLogger(__name__)


class Validator:
    def __init__(
        self,
        config: PPOTrainerConfig,
        tokenizer: Any,
        rollout_client: RolloutClient,
        reward_fn: Any,
        tracker: Any,
        loader: Any,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.rollout_client = rollout_client
        self.reward_fn = reward_fn
        self.tracker = tracker
        self.loader = loader
        self.history: list[tuple[int, dict[str, float]]] = []

    def summary(self) -> str:
        """``val-core`` metrics of the first and the last validation: ``name: 0.315 (step 0) -> ...``."""
        if not self.history:
            return "no validation ran"
        (first_step, first), (last_step, last) = self.history[0], self.history[-1]
        lines = [
            f"{key}: {first[key]:.3f} (step {first_step}) -> {last.get(key, float('nan')):.3f} (step {last_step})"
            for key in sorted(first)
            if key.startswith("val-core/")
        ]
        return "validation " + ("; ".join(lines) if lines else "ran without val-core metrics")

    def run(self, step: int) -> dict[str, float]:
        """Validate the current policy; logs sample generations when asked to."""
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        sources: list[str] = []
        uids: list[str] = []
        inputs: list[str] = []
        outputs: list[str] = []
        infos: dict[str, list[Any]] = {"reward": []}
        gts: list[Any] = []
        for batch_index, batch_dict in enumerate(self.loader):
            batch = DataProto.from_single_dict(batch_dict)
            batch = repeat_prompts(batch, f"val-{batch_index}", val_kwargs.n)
            prompts = pop_prompts(batch, self.config.actor_rollout_ref.rollout.uses_agent_loop)
            prompts.meta_info.update(validate=True, do_sample=val_kwargs.do_sample, global_steps=step)
            attach_responses(batch, self.rollout_client.generate_sequences(prompts))
            result = self.reward_fn(batch, return_dict=True)
            scores = result["reward_tensor"].sum(-1).tolist()
            infos["reward"].extend(scores)
            for key, values in result.get("reward_extra_info", {}).items():
                infos.setdefault(key, []).extend(values)
            sources.extend(batch.non_tensor_batch[self.config.data.reward_fn_key].tolist())
            uids.extend(batch.non_tensor_batch["uid"].tolist())
            inputs.extend(self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True))
            outputs.extend(_decode_responses(self.tokenizer, batch))
            gts.extend(ground_truths(batch))
        metrics = flatten_validation_metrics(process_validation_metrics(sources, uids, infos))
        self.history.append((step, metrics))
        n_logged = self.config.trainer.log_val_generations
        if n_logged > 0:
            self.tracker.log_generations(select_generations(inputs, outputs, infos["reward"], n_logged), step)
        if self.config.trainer.validation_data_dir:
            extra = {"data_source": sources, "uid": uids, **infos}
            write_generations(
                self.config.trainer.validation_data_dir, step, inputs, outputs, infos["reward"], gts, extra
            )
        return metrics


def _decode_responses(tokenizer: Any, batch: DataProto) -> list[str]:
    lengths = batch.batch["response_mask"].sum(-1).tolist()
    responses = batch.batch["responses"]
    return [tokenizer.decode(responses[i, : int(n)], skip_special_tokens=True) for i, n in enumerate(lengths)]
