"""verl's older SFT entry point (``python -m verl.trainer.fsdp_sft_trainer`` / ``torchrun ... -m``):
the same trainer and keys as :mod:`verl.trainer.sft_trainer`; the older spellings
(``model.partial_pretrain``, ``data.multiturn.*``, ``optim.warmup_steps_ratio``, ...) are converted."""

from __future__ import annotations

import sys

from verl.trainer.sft_trainer import main, prepare_sft_argv

if __name__ == "__main__":
    sys.argv[1:] = prepare_sft_argv(sys.argv[1:])
    main()
