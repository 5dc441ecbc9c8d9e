"""The install brings the packages verl brings that recipes import, and keeps the pinned torch."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
# distribution in requirements.txt -> the module a recipe imports
VERL_RECIPE_PACKAGES = {
    "datasets": "datasets",
    "codetiming": "codetiming",
    "torchdata": "torchdata.stateful_dataloader",
    "pylatexenc": "pylatexenc.latex2text",
}


def requirement_names(name: str) -> set[str]:
    lines = (REPO_ROOT / name).read_text().splitlines()
    return {
        re.split(r"[<>=!~\[;\s]", line.strip(), maxsplit=1)[0].lower()
        for line in lines
        if line.strip() and not line.startswith("#")
    }


@pytest.mark.parametrize("distribution, module", VERL_RECIPE_PACKAGES.items())
def test_a_package_verl_installs_is_required_and_imports(distribution, module):
    assert distribution in requirement_names("requirements.txt")
    importlib.import_module(module)


def test_torch_is_the_version_constraints_txt_pins():
    pins = [
        line
        for line in (REPO_ROOT / "constraints.txt").read_text().splitlines()
        if line.startswith("torch==")
    ]
    assert len(pins) == 1, pins
    assert torch.__version__.split("+")[0] == pins[0].removeprefix("torch==")
