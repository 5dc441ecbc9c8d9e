"""The lowest layer of verl: helpers that import nothing else of verl.

``hf_tokenizer`` and ``hf_processor`` are exported here as well as from
:mod:`verl.utils.tokenizer`, as in verl.
"""

from verl.utils.tokenizer import hf_processor, hf_tokenizer

__all__ = ["hf_processor", "hf_tokenizer"]
