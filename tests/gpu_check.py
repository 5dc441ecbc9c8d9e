"""Check this project on a machine with one CUDA GPU and write what happened to one markdown report.

    python3 tests/gpu_check.py --out gpu_check_report.md        # or: make gpu-check

Each step runs in its own subprocess under its own time limit, so a step that fails, crashes or
hangs is reported and the next one still runs; the whole check keeps within ``--budget-s``
(default 420 s) and the report is rewritten after every step, so a run cut off still leaves one.

* every test file under tests/ with a ``gpu`` mark, as ``python -m pytest -m gpu FILE``. This
  covers the fused log-prob/entropy Triton kernels (tests/utils/test_fused_log_probs.py) and
  packed sequences on varlen flash attention (tests/workers/test_packing.py). A test that needs
  Ray, vLLM or SGLang where it is not installed counts as skipped, with that reason;
* ``benchmarks/gpu_step.py --no-generate``: one bf16 update of the ~0.5B Qwen2.5 shape through
  the real policy worker (FSDP2) against a plain forward/backward/AdamW loop (tok/s, MFU, memory).

It needs this project's dependencies (``pip install -e .``; Ray, vLLM and SGLang are optional); on a
bare GPU machine with torch, install at least omegaconf, hydra-core and tensordict, or put their
wheels on PYTHONPATH. The report lists what is not installed.

Exit status: 0 when no step failed, 1 when one failed or ran out of time, 2 when this machine has
no CUDA GPU (then nothing runs and no report is written). Importing this module runs nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GPU_MARK = re.compile(r"pytest\.mark\.gpu\b")
# A test that stops at one of these imports needs a backend this machine lacks: skipped, not failed.
MISSING_BACKEND = re.compile(r"No module named '(ray|vllm|sglang)[.']")
TEST_LIMIT_S = 180
BENCH_LIMIT_S = 240
BENCH_RESERVE_S = 150  # the tests stop this long before the budget ends, so the benchmark still runs
BENCH_ARGS = "--no-generate --steps 2"  # generation on the GPU is tests/workers/test_gpu_worker.py's
TAIL_LINES = 15
# after the repository's addopts: list only the tests that took a second or more
PYTEST_ARGS = ("--durations=10", "--durations-min=1")
# Packages the check looks for (reported as present or missing); the first three are verl's own needs.
PACKAGES = ("omegaconf", "hydra", "tensordict", "pytest", "pytest_timeout", "triton", "liger_kernel")
PACKAGES += ("ray", "vllm", "sglang")
PROBE = """
import importlib.util, json, platform, torch
info = {"python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu": None, "packages": {}}
if torch.cuda.is_available():
    info["gpu"] = torch.cuda.get_device_name(0)
    info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
for name in ["transformers"] + NAMES:
    if importlib.util.find_spec(name) is None:
        info["packages"][name] = None
    else:
        module = importlib.import_module(name) if name in ("transformers", "triton") else None
        info["packages"][name] = getattr(module, "__version__", "installed")
print(json.dumps(info))
"""


@dataclass
class Step:
    """One step's outcome, as the report shows it."""

    name: str
    command: str
    status: str = "not run"  # passed | failed | skipped | timeout | not run
    seconds: float = 0.0
    figures: str = ""  # one line for the summary table
    details: list[str] = field(default_factory=list)  # failures, skip reasons, printed figures
    tail: str = ""


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    skip_reasons: list[str] = field(default_factory=list)


def gpu_test_files(root: Path = REPO_ROOT) -> list[Path]:
    """The test modules under tests/ that carry a ``pytest.mark.gpu``."""
    files = sorted((root / "tests").rglob("test_*.py"))
    return [f for f in files if GPU_MARK.search(f.read_text(errors="replace"))]


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    # benchmarks/ scripts import verl from the checkout, which is not installed on a bare GPU machine
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO_ROOT), env.get("PYTHONPATH", "")] if p)
    return env


def run_limited(cmd: list[str], limit_s: float) -> tuple[int | None, str, float]:
    """Run ``cmd`` from the repository root; (return code or None on timeout, output, seconds)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group: a timeout ends the step's children too
    )
    try:
        out, _ = proc.communicate(timeout=limit_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    return code, out, time.perf_counter() - start


def probe_environment(python: str) -> dict:
    """Versions, the card and which packages are installed, read in a child process."""
    code = PROBE.replace("NAMES", repr(list(PACKAGES)))
    rc, out, _ = run_limited([python, "-c", code], 120)
    if rc != 0:
        raise RuntimeError(f"could not read the environment (torch missing?):\n{out[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def tail(text: str, n: int = TAIL_LINES) -> str:
    lines = [line for line in text.rstrip().splitlines() if "generated xml file" not in line]
    return "\n".join(lines[-n:])


def read_junit(path: Path) -> Counts:
    """Per-test outcomes of a pytest run; a failure caused by a missing backend counts as a skip."""
    counts = Counts()
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            text = f"{bad.get('message', '')}\n{bad.text or ''}"
            backend = MISSING_BACKEND.search(text)
            if backend:
                counts.skipped += 1
                counts.skip_reasons.append(f"{test}: needs {backend.group(1)}, not installed here")
                continue
            counts.failed += 1
            errors = [line for line in (bad.text or "").splitlines() if line.startswith("E ")][:12]
            counts.failures.append(f"{test}: {bad.get('message', '')[:300]}\n" + "\n".join(errors))
        elif skip is not None:
            counts.skipped += 1
            counts.skip_reasons.append(f"{test}: {skip.get('message', '')}")
        else:
            counts.passed += 1
    return counts


def pytest_step(python: str, path: Path, limit_s: float) -> tuple[Step, Counts]:
    rel = path.relative_to(REPO_ROOT)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        xml = Path(scratch) / "junit.xml"
        cmd = [python, "-m", "pytest", "-m", "gpu", str(rel), "-p", "no:cacheprovider", *PYTEST_ARGS]
        step = Step(f"pytest {rel}", shlex.join(cmd))
        rc, out, step.seconds = run_limited([*cmd, f"--junitxml={xml}"], limit_s)
        counts = read_junit(xml) if xml.exists() else Counts()
    step.tail = tail(out)
    step.details = counts.failures + [f"skipped: {reason}" for reason in counts.skip_reasons]
    summary = re.findall(r"^=+ (.+) in [\d.]+s", out, re.MULTILINE)
    step.figures = summary[-1] if summary else f"exit code {rc}"
    step.status = pytest_status(rc, counts)
    if rc is None:
        step.figures = f"stopped after {limit_s:.0f} s"
    return step, counts


def pytest_status(rc: int | None, counts: Counts) -> str:
    """pytest exits 5 when no test was selected, 1 or 2 also when every failure was a missing backend."""
    if rc is None:
        return "timeout"
    if counts.failed or (rc not in (0, 5) and not (counts.passed or counts.skipped)):
        return "failed"
    return "passed" if counts.passed else "skipped"


BENCH_FIGURES = {
    "update tok/s": r"update_actor framework\s+([\d.]+) tok/s",
    "plain loop tok/s": r"plain torch\s+([\d.]+) tok/s",
    "time ratio": r"ratio \(framework time / baseline time\) ([\d.]+)",
    "MFU": r"update MFU ([\d.]+)",
}


def bench_step(python: str, bench_args: str, limit_s: float) -> Step:
    cmd = [python, "benchmarks/gpu_step.py", *shlex.split(bench_args)]
    step = Step("benchmarks/gpu_step.py", shlex.join(cmd))
    rc, out, step.seconds = run_limited(cmd, limit_s)
    step.tail = tail(out)
    found = {k: re.search(p, out) for k, p in BENCH_FIGURES.items()}
    step.figures = ", ".join(f"{k} {m.group(1)}" for k, m in found.items() if m)
    printed = out[out.find("device:") :] if "device:" in out else ""
    step.details = [f"printed figures:\n{printed.rstrip()}"] if printed else []
    if rc is None:
        step.status, step.figures = "timeout", f"stopped after {limit_s:.0f} s"
    else:
        step.status = "passed" if rc == 0 else "failed"
        last = step.tail.splitlines()[-1] if step.tail else "no output"
        step.figures = step.figures or f"exit code {rc}: {last}"
    return step


def render_report(env: dict, steps: list[Step], totals: Counts, started: str, seconds: float) -> str:
    packages = env["packages"]
    missing = [name for name, version in packages.items() if version is None]
    bad = [s.name for s in steps if s.status in ("failed", "timeout")]
    lines = [
        "# GPU check",
        "",
        f"- date (UTC): {started}; whole check {seconds:.0f} s",
        f"- card: {env['gpu']} ({env.get('gpu_memory_gib', '?')} GiB)",
        f"- python {env['python']}, torch {env['torch']} (CUDA {env['cuda']}), "
        f"transformers {packages['transformers']}, triton {packages.get('triton')}",
        f"- not installed: {', '.join(missing) or 'none'}",
        f"- GPU tests: {totals.passed} passed, {totals.failed} failed, {totals.skipped} skipped",
        f"- steps that failed or ran out of time: {', '.join(bad) or 'none'}",
        "",
        "| step | status | wall s | figures |",
        "| --- | --- | ---: | --- |",
        *(f"| {s.name} | {s.status} | {s.seconds:.1f} | {s.figures} |" for s in steps),
        "",
        "Coverage: the fused log-prob/entropy Triton kernels are tested by tests/utils/test_fused_log_probs.py",
        "and packed sequences on varlen flash attention by tests/workers/test_packing.py (its gpu case);",
        "both run above, there is no separate step for them.",
        "",
    ]
    for s in steps:
        lines += ["", f"## {s.name}: {s.status}", "", f"`{s.command}` ({s.seconds:.1f} s)", ""]
        lines += [f"```\n{detail}\n```" for detail in s.details]
        if s.tail:
            lines += ["last lines of output:", "", f"```\n{s.tail}\n```"]
    return "\n".join(lines) + "\n"


def run_check(args: argparse.Namespace, env: dict) -> int:
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    files = gpu_test_files()
    steps = [Step(f"pytest {f.relative_to(REPO_ROOT)}", "") for f in files] + [
        Step("benchmarks/gpu_step.py", "")
    ]
    totals = Counts()
    for i, path in enumerate(files):
        limit = min(TEST_LIMIT_S, deadline - BENCH_RESERVE_S - time.monotonic())
        if limit < 20:
            steps[i].status, steps[i].figures = "not run", "out of the check's time budget"
            continue
        print(f"[gpu-check] {steps[i].name} (limit {limit:.0f} s)", flush=True)
        steps[i], counts = pytest_step(args.python, path, limit)
        totals.passed += counts.passed
        totals.failed += counts.failed
        totals.skipped += counts.skipped
        print(f"[gpu-check]   {steps[i].status}: {steps[i].figures}", flush=True)
        write(args.out, render_report(env, steps, totals, started, time.monotonic() - t0))
    limit = min(BENCH_LIMIT_S, deadline - time.monotonic())
    if limit >= 30:
        print(f"[gpu-check] {steps[-1].name} {args.bench_args} (limit {limit:.0f} s)", flush=True)
        steps[-1] = bench_step(args.python, args.bench_args, limit)
        print(f"[gpu-check]   {steps[-1].status}: {steps[-1].figures}", flush=True)
    else:
        steps[-1].figures = "out of the check's time budget"
    write(args.out, render_report(env, steps, totals, started, time.monotonic() - t0))
    print(f"[gpu-check] report: {args.out}", flush=True)
    return 1 if any(s.status in ("failed", "timeout") for s in steps) else 0


def write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_check_report.md", help="the markdown report to write")
    p.add_argument("--budget-s", type=float, default=420.0, help="time for the whole check")
    p.add_argument("--bench-args", default=BENCH_ARGS, help="arguments of benchmarks/gpu_step.py")
    p.add_argument("--python", default=sys.executable, help="the interpreter the steps run with")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        env = probe_environment(args.python)
    except RuntimeError as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        return 2
    if env["gpu"] is None:
        print(
            f"gpu_check: no CUDA GPU on this machine (torch {env['torch']}); nothing was run and no "
            f"report written. Run it on a machine with one CUDA GPU: python3 tests/gpu_check.py",
            file=sys.stderr,
        )
        return 2
    print(f"[gpu-check] {env['gpu']}, torch {env['torch']}; report: {args.out}", flush=True)
    return run_check(args, env)


if __name__ == "__main__":
    sys.exit(main())
