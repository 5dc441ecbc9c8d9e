"""verl: RL post-training for language models in the HybridFlow style.

``from verl import DataProto, DataProtoFuture`` works as in verl. Both are loaded on first use
(PEP 562), because they bring torch, tensordict and Ray with them: ``import verl.config`` and the
other torch-free parts stay light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl.protocol import DataProto, DataProtoFuture

__version__ = (Path(__file__).parent / "version" / "version").read_text().strip()
"""The verl release whose behaviour and API this package follows; ``setup.py`` reads the same file."""

__all__ = ["DataProto", "DataProtoFuture", "__version__"]

_FROM_PROTOCOL = ("DataProto", "DataProtoFuture")


def __getattr__(name: str) -> Any:
    if name not in _FROM_PROTOCOL:
        raise AttributeError(f"module 'verl' has no attribute {name!r}")
    from verl import protocol  # here, not at the top: it loads torch (see the module's doc string)

    value = getattr(protocol, name)
    globals()[name] = value  # later lookups find it without coming here
    return value
