"""The local code sandbox, with real processes: what the code can do, and what it cannot.

Each test runs real code through `run_python` (or the CLI) and checks from outside that the
attempt failed inside and left no trace on the host. Timing asserts are generous upper bounds.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from verl.tools.sandbox import SandboxResult, run_python

REPO = Path(__file__).resolve().parents[2]
OK_TIMEOUT_S = 60.0  # for code that should finish quickly: only catches hangs
SLACK_S = 10.0  # how long past its limit a killed run may take on a busy machine

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox uses Linux namespaces", allow_module_level=True)
_probe = run_python("print('ready')", timeout_s=OK_TIMEOUT_S)
if _probe.status == "error" and "unshare(" in _probe.stderr:
    pytest.skip(f"this kernel/container forbids user namespaces: {_probe.stderr}", allow_module_level=True)


def run(code: str, **kwargs) -> SandboxResult:
    kwargs.setdefault("timeout_s", OK_TIMEOUT_S)
    return run_python(textwrap.dedent(code), **kwargs)


def processes_named(marker: str) -> list[int]:
    """Host pids whose name (comm) is `marker`: the sandboxed code sets it on itself."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == marker:
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_runs_code_and_returns_stdout_stderr_and_exit_code():
    result = run("import sys\nprint('hello', 6 * 7)\nprint('warn', file=sys.stderr)\n")
    assert (result.status, result.exit_code) == ("ok", 0), result
    assert result.stdout == "hello 42\n"
    assert result.stderr == "warn\n"
    assert 0 < result.wall_s < OK_TIMEOUT_S
    failed = run("raise SystemExit(3)")
    assert (failed.status, failed.exit_code) == ("failed", 3)


def test_scratch_is_the_writable_working_directory():
    result = run("""
        import os, tempfile
        open("note.txt", "w").write("kept")
        with tempfile.NamedTemporaryFile() as f:
            print(os.getcwd(), f.name.startswith("/scratch/"), open("/scratch/note.txt").read())
    """)
    assert result.stdout.split() == ["/scratch", "True", "kept"], result


def test_network_is_refused_even_to_a_server_on_the_hosts_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        result = run(f"""
            import socket
            for addr in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
                try:
                    socket.create_connection(addr, timeout=5).close()
                    print("CONNECTED", addr)
                except OSError as exc:
                    print("refused", addr, exc.errno)
            try:
                socket.getaddrinfo("example.com", 80)
                print("RESOLVED")
            except OSError:
                print("refused dns")
        """)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the host's listener
    finally:
        server.close()
    assert result.status == "ok", result
    assert result.stdout.count("refused") == 4 and "CONNECTED" not in result.stdout, result.stdout


def test_writes_outside_scratch_fail_and_leave_the_host_untouched(tmp_path):
    name = f"sandbox-escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{name}", str(REPO / name), str(tmp_path / name), f"/usr/{name}", f"/{name}"]
    result = run(f"""
        for path in {targets!r}:
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as exc:
                print("denied", exc.errno)
        open("/scratch/{name}", "w").write("x")
        print("scratch ok")
    """)
    assert result.status == "ok", result
    assert result.stdout.count("denied") == len(targets) and "WROTE" not in result.stdout, result.stdout
    assert "scratch ok" in result.stdout
    assert not any(os.path.lexists(p) for p in targets)


def test_files_outside_scratch_cannot_be_read(tmp_path):
    secret = f"secret-{uuid.uuid4().hex}"
    (tmp_path / "secret.txt").write_text(secret)
    repo_file = REPO / "pyproject.toml"
    paths = [
        str(tmp_path / "secret.txt"),
        str(repo_file),
        "/root/.bashrc",
        "/etc/shadow",
        "/proc/1/root/etc/shadow",
    ]
    result = run(f"""
        import os
        for path in {paths!r}:
            try:
                print("READ", path, open(path).read())
            except OSError as exc:
                print("denied", exc.errno)
        for path in ["/root", "/home", "/work", {str(tmp_path)!r}]:
            try:
                print("LISTED", path, os.listdir(path))
            except OSError as exc:
                print("denied", exc.errno)
        print(open("/etc/passwd").read())
    """)
    assert result.status == "ok", result
    assert secret not in result.stdout and "[tool.ruff]" not in result.stdout
    assert "READ" not in result.stdout and "denied" in result.stdout, result.stdout
    # /root exists only as the path to a bound interpreter (pyenv), and shows nothing else.
    for line in result.stdout.splitlines():
        if line.startswith("LISTED"):
            assert line.split()[1] == "/root" and ".bashrc" not in line, line
    assert "root:" not in result.stdout  # the host's /etc/passwd is not the one shown


def test_the_parents_environment_is_not_visible(monkeypatch):
    secret = f"env-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("VERL_SANDBOX_TEST_SECRET", secret)
    result = run("""
        import os
        print("ENV", sorted(os.environ))
        print("PPID", os.getppid(), "PIDS", sorted(p for p in os.listdir("/proc") if p.isdigit()))
        for pid in ["self", "1", str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                print("environ", pid, open(f"/proc/{pid}/environ", "rb").read())
            except OSError as exc:
                print("denied", pid, exc.errno)
    """)
    assert result.status == "ok", result
    assert secret not in result.stdout and secret not in result.stderr
    assert "ENV ['HOME', 'LANG', 'PATH', 'TMPDIR']" in result.stdout
    assert "environ self b'PATH=" in result.stdout  # /proc works: the check is real
    pids = result.stdout.split("PIDS ")[1].splitlines()[0]
    assert str(os.getpid()) not in eval(pids)  # the host's processes are not in its /proc


def test_runaway_cpu_is_killed_at_the_timeout():
    result = run("while True:\n    pass\n", timeout_s=1.5)
    assert result.status == "timeout", result
    assert result.wall_s < 1.5 + SLACK_S


def test_a_sleeping_program_is_killed_at_the_wall_clock_timeout():
    result = run("import time\nprint('start', flush=True)\ntime.sleep(600)\n", timeout_s=1.5)
    assert result.status == "timeout" and result.stdout == "start\n", result
    assert result.wall_s < 1.5 + SLACK_S


def test_memory_beyond_the_limit_is_refused():
    result = run(
        """
        blocks = [bytearray(16 << 20) for _ in range(64)]  # 1 GiB in 16 MiB steps
        print("ALLOCATED", len(blocks))
        """,
        memory_mb=128,
    )
    assert result.status in ("failed", "killed"), result
    assert "ALLOCATED" not in result.stdout and "MemoryError" in result.stderr


def test_the_process_limit_stops_forks_and_a_fork_bomb_is_contained():
    marker = f"sbx{uuid.uuid4().hex[:10]}"
    counted = run(
        """
        import os, time
        children = 0
        for _ in range(50):
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                children += 1
            except OSError:
                break
        print(children)
        """,
        max_processes=8,
    )
    assert counted.status == "ok" and int(counted.stdout) < 8, counted
    bomb = run(
        f"""
        import os
        open("/proc/self/comm", "w").write("{marker}")
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        timeout_s=2.0,
        max_processes=16,
    )
    assert bomb.status == "timeout" and bomb.wall_s < 2.0 + SLACK_S, bomb
    assert processes_named(marker) == []
    assert run("print('still fine')").stdout == "still fine\n"


def test_nothing_is_left_running_after_the_code_exits():
    marker = f"sbx{uuid.uuid4().hex[:10]}"
    result = run(f"""
        import os, time
        if os.fork() == 0:  # a daemon: new session, double fork, outlives its parent
            os.setsid()
            if os.fork() == 0:
                open("/proc/self/comm", "w").write("{marker}")
                time.sleep(600)
            os._exit(0)
        time.sleep(0.5)
        print("parent exits")
    """)
    assert result.status == "ok" and result.stdout == "parent exits\n", result
    assert processes_named(marker) == []


def test_output_beyond_the_cap_is_truncated_and_says_so():
    result = run("print('x' * 1_000_000)", max_output_bytes=1000)
    assert result.status == "ok", result
    assert result.stdout.startswith("x" * 1000) and "output truncated to 1000 bytes" in result.stdout
    assert len(result.stdout) < 1200


def test_the_code_cannot_gain_privileges_or_new_namespaces():
    result = run("""
        import ctypes, os
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        print("uid", os.getuid(), "caps", status["CapEff"].strip(), "nnp", status["NoNewPrivs"].strip())
        libc = ctypes.CDLL(None, use_errno=True)
        print("unshare", libc.unshare(0x10000000), "umount", libc.umount2(b"/usr", 2))
    """)
    assert result.status == "ok", result
    assert "uid 65534 caps 0000000000000000 nnp 1" in result.stdout, result.stdout
    assert "unshare -1 umount -1" in result.stdout


def test_cli_prints_exactly_one_json_line(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("print('from file')\n")
    cmd = [sys.executable, "-m", "verl.tools.sandbox", str(script), "--timeout", "60", "--memory_mb", "256"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 1, proc
    record = json.loads(lines[0])
    assert set(record) == {"status", "exit_code", "stdout", "stderr", "wall_s"}
    assert (record["status"], record["stdout"]) == ("ok", "from file\n")
    missing = subprocess.run([*cmd[:3], str(tmp_path / "nope.py")], capture_output=True, text=True, cwd=REPO)
    assert json.loads(missing.stdout)["status"] == "error"


RESTRICTED = {
    # A user whose namespace may have one nested namespace, already used by itself.
    "no_namespaces_left": (
        "echo 1 > /proc/sys/user/max_user_namespaces && exec unshare --user --map-user=1000 --map-group=1000",
        "unshare(",
    ),
    # Root of a namespace where `nobody` does not exist and groups cannot be changed.
    "root_without_nobody": ("exec", "supplementary groups"),
}


@pytest.mark.parametrize("case", sorted(RESTRICTED))
def test_fails_closed_where_the_os_lacks_what_it_needs(tmp_path, case):
    """The code must not run at all, and the error must say which step failed."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux `unshare` is needed to build the restricted environment")
    prefix, expected = RESTRICTED[case]
    script = tmp_path / "prog.py"
    flag = tmp_path / "ran"
    script.write_text(f"open({str(flag)!r}, 'w').write('unconfined')\nprint('RAN')\n")
    inner = f"{prefix} {sys.executable} -m verl.tools.sandbox {script}"
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", inner],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    if proc.returncode != 0 and not proc.stdout:
        pytest.skip(f"cannot build the restricted environment here: {proc.stderr.strip()}")
    record = json.loads(proc.stdout)
    assert record["status"] == "error" and expected in record["stderr"], record
    assert "RAN" not in record["stdout"] and not flag.exists()
