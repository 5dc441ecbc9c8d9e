"""The Docker images are linted (hadolint, installed with the test extras): they cannot be built
on the CI machines (no Docker daemon), so this is what checks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile.*"))


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint is missing: it comes with the test extras (pip install -e '.[test]')"
    return found


def lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([hadolint(), str(path)], capture_output=True, text=True, timeout=120, check=False)


def test_the_cpu_and_gpu_images_exist():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    result = lint(dockerfile)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_an_unpinned_install(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN apt-get update && apt-get install -y curl\n")
    result = lint(bad)
    assert result.returncode != 0 and "DL3008" in result.stdout  # apt packages must be pinned


def test_the_cpu_image_runs_the_readme_test_command():
    text = (REPO / "docker" / "Dockerfile.cpu").read_text()
    assert 'CMD ["make", "test"]' in text and "make install-test" in text
