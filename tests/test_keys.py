"""Every batch key the package reads or writes is documented in verl/keys.py."""

from __future__ import annotations

import re
from pathlib import Path

from verl.keys import BATCH_KEYS, META_KEYS, NON_TENSOR_KEYS

PACKAGE = Path(__file__).resolve().parents[1] / "verl"
PATTERNS = {
    "batch": (re.compile(r"""\.batch\[["'](\w+)["']\]"""), BATCH_KEYS),
    "non_tensor_batch": (re.compile(r"""non_tensor_batch\[["'](\w+)["']\]"""), NON_TENSOR_KEYS),
    "meta_info": (re.compile(r"""meta_info(?:\.get\(|\[)["'](\w+)["']"""), META_KEYS),
}


def test_batch_keys_used_in_the_package_are_documented():
    undocumented = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        for part, (pattern, documented) in PATTERNS.items():
            for key in pattern.findall(text):
                if key not in documented:
                    undocumented.append(f"{path.relative_to(PACKAGE.parent)}: {part}[{key!r}]")
    assert not undocumented, "document these keys in verl/keys.py:\n" + "\n".join(sorted(set(undocumented)))


def test_documented_keys_have_text():
    for table in (BATCH_KEYS, NON_TENSOR_KEYS, META_KEYS):
        assert all(isinstance(doc, str) and len(doc) > 10 for doc in table.values())
