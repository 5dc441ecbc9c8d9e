"""Continuous batching over the ``hf`` rollout's model, for server mode.

The running requests form one left-padded batch with one KV cache. Each step feeds every
row its last token; a finished row leaves its result at once and stays in the batch as
padding until the batch is rebuilt. The batch is rebuilt (one prefill of every running
request's prompt and tokens so far) when requests join, and after a weight update, so that
the cache of every request in flight is recomputed under the new weights.

Each request samples with its own generator (seeded by the request, or by the engine seed
and a counter), so its tokens do not depend on which other requests it was batched with.
Log-probs are those seen while decoding; they differ from a teacher-forced forward by float
rounding of the cached attention (the weight-sync probe and the logged
``training/rollout_probs_diff_*`` measure it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.utils.mrope import model_position_ids, mrope_position_ids
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.sampling import derived_seed, sample_with_uniforms
from verl.workers.rollout.server import Delta, GenerationRequest, StepEngine
from verl.workers.vision import micro_batch_vision, mrope_spec


@dataclass
class _Row:
    request: GenerationRequest
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    done: bool = False


class HFStepEngine(StepEngine):
    takes_images = True  # a vision-language model's requests carry their images (M-RoPE positions here)

    @classmethod
    def create(cls, rollout: HFRollout, config: Any) -> HFStepEngine:
        return cls(rollout, config.max_num_seqs)

    def __init__(self, rollout: HFRollout, max_num_seqs: int) -> None:
        self.rollout = rollout
        self.max_num_seqs = max(1, max_num_seqs)
        self.device = rollout.device
        self.eos = set(rollout.eos_token_ids.tolist())
        self.waiting: deque[_Row] = deque()
        self.rows: list[_Row] = []  # the running batch, in cache order
        self.stale = True  # the cache must be rebuilt before the next decode
        self.cache = None
        self.mask = self.next_pos = self.last_tokens = None
        self.requests_seen = 0
        self.mrope = mrope_spec(getattr(rollout.module, "config", None))  # (image token, merge) of a VLM

    def add(self, request: GenerationRequest) -> None:
        vocab = self.rollout.module.get_input_embeddings().num_embeddings
        if not request.prompt_ids or not all(0 <= t < vocab for t in request.prompt_ids):
            raise ValueError(
                f"request {request.request_id}: the prompt must be a non-empty list of token ids in "
                f"[0, {vocab}) (the model's vocabulary)"
            )
        self._check_images(request)
        seed = (
            request.seed if request.seed is not None else derived_seed(self.rollout.seed, self.requests_seen)
        )
        self.requests_seen += 1
        generator = torch.Generator().manual_seed(int(seed))
        self.waiting.append(_Row(request, generator))

    def _check_images(self, request: GenerationRequest) -> None:
        """A request's image blocks must match its images: one image token per merged patch."""
        if self.mrope is None:
            if request.multi_modal_inputs:
                raise ValueError(f"request {request.request_id}: images for a text-only model")
            return
        token, merge = self.mrope
        grid = (request.multi_modal_inputs or {}).get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        expected = int((grid.prod(-1) // merge**2).sum())
        found = request.prompt_ids.count(token)
        if found != expected:
            raise ValueError(
                f"request {request.request_id}: the prompt has {found} image tokens but its "
                f"{len(grid)} image(s) need {expected} (one per merged patch)"
            )

    def abort(self, request_id: str) -> None:
        self.waiting = deque(r for r in self.waiting if r.request.request_id != request_id)
        for row in self.rows:
            if row.request.request_id == request_id:
                row.done = True

    def has_work(self) -> bool:
        return bool(self.waiting) or any(not r.done for r in self.rows)

    def weights_changed(self) -> None:
        self.stale = True

    @torch.no_grad()
    def step(self) -> list[Delta]:
        if self.rollout._apply_pending():  # weights staged by a direct update_weights call
            self.stale = True
        self._admit()
        if not self.rows:
            return []
        logits = self._rebuild() if self.stale else self._decode()
        return self._sample(logits)

    def _admit(self) -> None:
        running = [r for r in self.rows if not r.done]
        if self.waiting and len(running) < self.max_num_seqs:
            while self.waiting and len(running) < self.max_num_seqs:
                running.append(self.waiting.popleft())
            self.stale = True
        if self.stale:  # finished rows leave only when the batch is rebuilt anyway
            self.rows = running

    def _rebuild(self) -> torch.Tensor:
        """Prefill every running request (prompt + tokens so far), left-padded."""
        sequences = [r.request.prompt_ids + r.tokens for r in self.rows]
        width = max(len(s) for s in sequences)
        pad = self.rollout.pad_token_id
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences], device=self.device)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], device=self.device)
        pos, vision = self._positions(ids, mask)
        logits, self.cache = self.rollout._prefill(ids, mask, pos, vision)
        self.mask, self.next_pos = mask, pos[..., -1:] + 1
        self.stale = False
        return logits

    def _positions(
        self, ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The running batch's positions and image inputs: ``[B, L]`` for a text model; ``[B, 3, L]``
        M-RoPE positions and the rows' images in row order for a vision-language model."""
        if self.mrope is None:
            return (mask.cumsum(-1) - 1).clamp(min=0), {}
        token, merge = self.mrope
        images = [r.request.multi_modal_inputs or {} for r in self.rows]
        empty = torch.zeros(0, 3, dtype=torch.long)
        pos = torch.stack(
            [
                mrope_position_ids(ids[i].cpu(), mask[i].cpu(), im.get("image_grid_thw", empty), token, merge)
                for i, im in enumerate(images)
            ]
        )
        return pos.to(self.device), {k: v.to(self.device) for k, v in micro_batch_vision(images).items()}

    def _decode(self) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        out = self.rollout.module(
            input_ids=self.last_tokens[:, None],
            attention_mask=self.mask,
            position_ids=model_position_ids(self.next_pos),
            past_key_values=self.cache,
            use_cache=True,
        )
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1].float()

    def _sample(self, logits: torch.Tensor) -> list[Delta]:
        # an image token without its image is never drawn; the reported log-prob stays that of the
        # model's whole distribution (what the trainer recomputes), as with top-k/top-p filtering
        allowed = logits
        if len(self.rollout.placeholder_ids):
            allowed = logits.clone()
            allowed[:, self.rollout.placeholder_ids] = float("-inf")
        tokens = torch.full((len(self.rows),), self.rollout.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(len(self.rows))
        groups: dict = {}  # rows with the same sampling parameters are drawn together
        for i, row in enumerate(self.rows):
            if not row.done:
                groups.setdefault(row.request.params, []).append(i)
        for params, index in groups.items():
            uniforms = torch.cat([torch.rand(1, generator=self.rows[i].generator) for i in index])
            chosen, lps = sample_with_uniforms(allowed[index], params, uniforms)
            if allowed is not logits:
                temperature = params.temperature if params.do_sample else 1.0  # greedy: at temperature 1
                lps = torch.log_softmax(logits[index] / temperature, -1).gather(-1, chosen[:, None])[:, 0]
            tokens[index], log_probs[index] = chosen.cpu(), lps.float().cpu()
        self.last_tokens = tokens.to(self.device)
        return [
            self._advance(row, int(tokens[i]), float(log_probs[i]))
            for i, row in enumerate(self.rows)
            if not row.done
        ]

    def _advance(self, row: _Row, token: int, log_prob: float) -> Delta:
        row.tokens.append(token)
        params = row.request.params
        finish = None
        if token in self.eos and not params.ignore_eos:
            finish = "stop"
        elif len(row.tokens) >= params.response_length:
            finish = "length"
        row.done = finish is not None
        return Delta(row.request.request_id, [token], [log_prob], finish)
