"""The lowest layer of verl: helpers that import nothing else of verl.

``hf_tokenizer``, ``hf_processor`` and ``omega_conf_to_dataclass`` are exported here as well as
from :mod:`verl.utils.tokenizer` and :mod:`verl.utils.config`, as in verl.
"""

from verl.utils.config import omega_conf_to_dataclass
from verl.utils.tokenizer import hf_processor, hf_tokenizer

__all__ = ["hf_processor", "hf_tokenizer", "omega_conf_to_dataclass"]
