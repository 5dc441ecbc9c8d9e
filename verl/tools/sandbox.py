"""Local code sandbox: run untrusted Python in a separate process isolated by the OS.

No external service and no API key. The code runs as an unprivileged user in fresh user, mount,
pid, network, IPC, UTS and cgroup namespaces, sees only read-only system directories and a private
scratch tmpfs, gets an empty environment and rlimits on CPU, memory, processes and file size; a
wall-clock deadline and the pid namespace make sure nothing is left running. Where the kernel
lacks these features the result is status "error" and the code never runs. Threat model and
details: docs/sandbox.md. The confinement itself lives in `sandbox_launcher.py`.

Library:   run_python("print(1)", timeout_s=5, memory_mb=256) -> SandboxResult
Command:   python -m verl.tools.sandbox FILE [--timeout S] [--memory_mb MB]
           prints one JSON line {"status", "exit_code", "stdout", "stderr", "wall_s"}.

Status values:
  ok       the code ran and exited with code 0
  failed   the code ran and exited with a non-zero code (an exception, sys.exit(n), MemoryError)
  timeout  the wall-clock or CPU-time limit was reached and the code was killed
  killed   the code died from a signal (e.g. SIGSEGV, SIGKILL, SIGXFSZ on an oversized file)
  error    the sandbox could not be set up (or the input was refused); the code did not run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Literal

Status = Literal["ok", "failed", "timeout", "killed", "error"]

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")
# Directories shown read-only inside; those missing on this machine are skipped.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
MAX_CODE_BYTES = 4 << 20
# The sandbox enforces its deadline itself; the supervisor kills everything only if that failed.
BACKSTOP_S = 10.0
DRAIN_AFTER_KILL_S = 5.0  # how long to wait for the pipes to close once the tree is killed


@dataclasses.dataclass
class SandboxResult:
    """The outcome of one run; `as_dict` is the CLI's JSON line."""

    status: Status
    exit_code: int | None  # the code's exit code, -N if killed by signal N, None if it never ended
    stdout: str
    stderr: str
    wall_s: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Stream:
    limit: int
    data: bytearray = dataclasses.field(default_factory=bytearray)
    dropped: int = 0

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        self.data += chunk[: max(room, 0)]
        self.dropped += max(len(chunk) - max(room, 0), 0)

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[verl sandbox: output truncated to {self.limit} bytes, {self.dropped} dropped]"
        return text


def _python_and_binds() -> tuple[str, list[str]]:
    """The interpreter to run the code with (the base one, not a venv) and what it needs."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    binds = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    for extra in (os.path.realpath(sys.base_prefix), os.path.dirname(python)):
        covered = any(extra == b or extra.startswith(b + "/") for b in binds)
        if not covered:
            binds.append(extra)
    return python, binds


def run_python(
    code: str | bytes,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_processes: int = 16,
    max_output_bytes: int = 64 << 10,
    scratch_mb: int = 64,
) -> SandboxResult:
    """Run `code` as a Python program in the sandbox and return what it printed and how it ended.

    timeout_s: wall-clock limit for the whole run; also the CPU-time limit of each process.
    memory_mb: address-space limit of each process in the sandbox (RLIMIT_AS).
    max_processes: processes and threads the code may have at once, itself included.
    max_output_bytes: stdout and stderr are each cut at this size (the text says so).
    scratch_mb: size of the private writable /scratch (the code's working directory).
    """
    start = time.monotonic()
    raw = code.encode() if isinstance(code, str) else code
    if sys.platform != "linux":
        return _refused(f"the sandbox needs Linux namespaces; this is {sys.platform}", start)
    if len(raw) > MAX_CODE_BYTES:
        return _refused(f"code is {len(raw)} bytes, more than the {MAX_CODE_BYTES} allowed", start)
    if timeout_s <= 0 or memory_mb < 32 or max_processes < 1 or scratch_mb < 1:
        return _refused("timeout_s must be > 0, memory_mb >= 32, max_processes >= 1, scratch_mb >= 1", start)
    python, binds = _python_and_binds()
    status_r, status_w = os.pipe()
    config = {
        "status_fd": status_w,
        "python": python,
        "binds": binds,
        "timeout_s": timeout_s,
        "memory_mb": memory_mb,
        "max_processes": max_processes,
        "scratch_mb": scratch_mb,
        "deadline": start + timeout_s,  # CLOCK_MONOTONIC is shared by every process
    }
    try:
        proc = subprocess.Popen(
            [python, "-I", "-S", LAUNCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
            env={},
            cwd="/",
            start_new_session=True,  # its own process group, killed as a whole at the deadline
        )
    finally:
        os.close(status_w)
    try:
        header = json.dumps(config).encode() + b"\n"
        return _supervise(proc, header + raw, status_r, start, timeout_s, max_output_bytes)
    finally:
        if proc.poll() is None:  # only an unreaped launcher's group id is surely still ours
            _kill_group(proc)
            proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
        os.close(status_r)


def _supervise(
    proc: subprocess.Popen, raw: bytes, status_r: int, start: float, timeout_s: float, limit: int
) -> SandboxResult:
    try:
        proc.stdin.write(raw)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the launcher failed early; its status pipe says why
    out, err, status = _Stream(limit), _Stream(limit), _Stream(1 << 16)
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, status_r: status}
    backstop = _pump(streams, start + timeout_s + BACKSTOP_S)
    if backstop:
        _kill_group(proc)
        _pump({proc.stdout.fileno(): out, proc.stderr.fileno(): err}, time.monotonic() + DRAIN_AFTER_KILL_S)
    proc.wait()
    wall_s = round(time.monotonic() - start, 3)
    reports = {}
    for line in status.data.decode(errors="replace").splitlines():
        for key, value in json.loads(line).items():
            reports.setdefault(key, value)  # the first error (a worker's, before init's) wins
    return _result(reports, backstop, out.text(), err.text(), wall_s, proc.returncode)


def _result(reports: dict, backstop: bool, stdout: str, stderr: str, wall_s: float, rc: int) -> SandboxResult:
    """Status from the sandbox's reports; precedence: error > the code's own end > timeout."""
    if "error" in reports:
        return SandboxResult("error", None, stdout, stderr + reports["error"], wall_s)
    if "exit_code" in reports:
        code = reports["exit_code"]
        return SandboxResult("ok" if code == 0 else "failed", code, stdout, stderr, wall_s)
    if "signal" in reports:
        sig = reports["signal"]
        name = "timeout" if sig == signal.SIGXCPU else "killed"
        note = f"\n[verl sandbox: killed by {signal.Signals(sig).name}]"
        return SandboxResult(name, -sig, stdout, stderr + note, wall_s)
    if "timeout" in reports or backstop:
        return SandboxResult("timeout", None, stdout, stderr, wall_s)
    message = f"sandbox launcher ended without a report (exit status {rc})"
    return SandboxResult("error", None, stdout, stderr + message, wall_s)


def _pump(streams: dict[int, _Stream], deadline: float) -> bool:
    """Read the pipes until all are closed (False) or the deadline passes (True)."""
    with selectors.DefaultSelector() as sel:
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    streams[key.fd].add(chunk)
                else:
                    sel.unregister(key.fd)
    return False


def _kill_group(proc: subprocess.Popen) -> None:
    # Killing the launcher's group kills init, and init's death kills its whole pid namespace,
    # including processes that left the group with setsid().
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _refused(message: str, start: float) -> SandboxResult:
    return SandboxResult("error", None, "", message, round(time.monotonic() - start, 3))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the Python file to run")
    parser.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit in seconds")
    parser.add_argument("--memory_mb", type=int, default=512, help="memory limit per process in MiB")
    args = parser.parse_args(argv)
    try:
        with open(args.file, "rb") as f:
            code = f.read(MAX_CODE_BYTES + 1)
    except OSError as exc:
        result = SandboxResult("error", None, "", f"cannot read {args.file}: {exc}", 0.0)
    else:
        result = run_python(code, timeout_s=args.timeout, memory_mb=args.memory_mb)
    print(json.dumps(result.as_dict()), flush=True)


if __name__ == "__main__":
    main()
