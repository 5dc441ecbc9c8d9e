"""The process tree inside the sandbox; started by `verl.tools.sandbox`, never imported by it.

Run as `python -I -S sandbox_launcher.py` with an empty environment, a JSON config line then the
code on stdin, and a status pipe on `config["status_fd"]`. Standard library only, because it runs
before (and partly after) the rest of the filesystem disappears. Three processes:

* launcher (this script's main process): reads the code, opens the directories to show
  read-only, drops root to `nobody`, unshares every namespace, forks init.
* init (pid 1 of the new pid namespace): builds a new root on tmpfs (read-only binds of the
  interpreter and system libraries, a private scratch tmpfs, a fresh /proc), pivots into it,
  forks the worker, reaps everything, reports the worker's end on the status pipe and exits;
  the kernel then kills whatever is left in the namespace.
* worker: sets the rlimits and no_new_privs, then execs Python on the code as an unprivileged
  user, so it keeps no capability.

Any failure before the exec reports `{"error": ...}` and the code never runs. See docs/sandbox.md.
"""

import contextlib
import ctypes
import json
import math
import os
import platform
import resource
import signal
import sys
import time

# From <linux/sched.h>, <linux/mount.h>, <linux/prctl.h>; identical on every Linux architecture.
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
ST_NOATIME, ST_NODIRATIME, ST_RELATIME = 1024, 2048, 4096
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}

NOBODY = 65534  # the user the code runs as, inside and (when started by root) outside
NEW_ROOT = "/tmp"  # mount point of the new root's tmpfs inside our private mount namespace
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
ETC_FILES = {
    "passwd": "nobody:x:65534:65534:nobody:/scratch:/usr/sbin/nologin\n",
    "group": "nogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost\n",
}

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """A confinement step failed: the code must not run."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what} failed: {os.strerror(errno)} (errno {errno})")


def _mount(source, target, fstype, flags: int, data=None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _report(status_fd: int, record: dict) -> None:
    os.write(status_fd, (json.dumps(record) + "\n").encode())


def _id_maps() -> tuple[str, str, int]:
    """uid_map and gid_map text for the child, and how many helper processes share its user.

    Root maps itself (for the setup steps) and `nobody` (for the code); the worker switches to
    `nobody` before exec, so the code is unprivileged and subject to RLIMIT_NPROC, from which
    root is exempt. Anyone else may only map their own ids, so the code runs under them.
    """
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        return f"0 0 1\n{NOBODY} {NOBODY} 1", f"0 0 1\n{NOBODY} {NOBODY} 1", 0
    return f"{NOBODY} {uid} 1", f"{NOBODY} {gid} 1", 2  # the child and init count as this user


def _map_ids(child: int, uid_map: str, gid_map: str) -> None:
    _write(f"/proc/{child}/setgroups", "deny")
    _write(f"/proc/{child}/uid_map", uid_map)
    _write(f"/proc/{child}/gid_map", gid_map)


def _unshare() -> None:
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    ret = libc.unshare(flags | CLONE_NEWCGROUP)
    if ret != 0:
        errno = ctypes.get_errno()
        raise SetupError(
            f"unshare(user, mount, pid, net, ipc, uts, cgroup namespaces) failed: {os.strerror(errno)}. "
            "This kernel or container does not allow unprivileged user namespaces "
            "(check /proc/sys/user/max_user_namespaces, kernel.unprivileged_userns_clone, "
            "and the container's seccomp/AppArmor profile)"
        )


def _bind(source: str, target: str, writable: bool = False) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    # A remount in a user namespace must keep the flags the host locked (nodev, atime...).
    current = os.statvfs(target).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (current & (MS_NODEV | MS_NOEXEC))
    flags |= MS_RDONLY if not writable or current & MS_RDONLY else 0
    if current & ST_NOATIME:
        flags |= MS_NOATIME
    elif current & ST_RELATIME:
        flags |= MS_RELATIME
    else:
        flags |= MS_STRICTATIME
    flags |= MS_NODIRATIME if current & ST_NODIRATIME else 0
    _mount(None, target, None, flags)


def _build_root(config: dict, code: bytes) -> None:
    """Populate NEW_ROOT: system dirs read-only, /dev nodes, /proc, /etc stubs, scratch."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in config["binds"]:
        target = NEW_ROOT + path
        if os.path.islink(path):  # e.g. /lib -> usr/lib on merged-/usr systems
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.readlink(path), target)
        else:
            os.makedirs(target, exist_ok=True)
            _bind(path, target)
    os.makedirs(NEW_ROOT + "/dev")
    for dev in DEVICES:
        open(NEW_ROOT + dev, "w").close()
        _bind(dev, NEW_ROOT + dev, writable=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{NEW_ROOT}/dev/{name}")
    os.symlink("/proc/self/fd/1", NEW_ROOT + "/dev/stdout")
    os.symlink("/proc/self/fd/2", NEW_ROOT + "/dev/stderr")
    os.makedirs(NEW_ROOT + "/etc")
    for name, text in ETC_FILES.items():
        _write(f"{NEW_ROOT}/etc/{name}", text)
    os.makedirs(NEW_ROOT + "/tmp")  # stays empty and read-only; TMPDIR points to /scratch
    os.makedirs(NEW_ROOT + "/proc")
    # A fresh /proc shows only this pid namespace. It must be mounted while the host's /proc is
    # still visible (the kernel refuses otherwise); without it the sandbox simply has no /proc.
    with contextlib.suppress(SetupError):
        _mount("proc", NEW_ROOT + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(NEW_ROOT + "/scratch")
    scratch_opts = f"size={int(config['scratch_mb'])}m,mode=0700,uid={NOBODY},gid={NOBODY}"
    _mount("tmpfs", NEW_ROOT + "/scratch", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, scratch_opts)
    with open(NEW_ROOT + "/scratch/main.py", "wb") as f:
        f.write(code)
    os.chown(NEW_ROOT + "/scratch/main.py", NOBODY, NOBODY)


def _pivot_root() -> None:
    """Make NEW_ROOT the root and detach the old one, so no path leads back to the host."""
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise SetupError(f"pivot_root syscall number unknown for architecture {platform.machine()}")
    os.chdir(NEW_ROOT)
    _check(libc.syscall(number, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _exec_worker(config: dict, helpers: int) -> None:
    """Set the limits, drop to `nobody`, become the user's program. Never returns."""
    cpu_s = math.ceil(config["timeout_s"])
    mem = int(config["memory_mb"]) << 20
    limits = {
        resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),
        resource.RLIMIT_AS: (mem, mem),
        resource.RLIMIT_NPROC: (config["max_processes"] + helpers,) * 2,
        resource.RLIMIT_FSIZE: (int(config["scratch_mb"]) << 20,) * 2,
        resource.RLIMIT_NOFILE: (256, 256),
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_MEMLOCK: (0, 0),
    }
    for which, value in limits.items():
        resource.setrlimit(which, value)
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)  # a non-root uid loses every capability at exec
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.chdir("/scratch")
    os.set_inheritable(config["status_fd"], False)
    python = config["python"]
    env = {
        "PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/scratch",
        "TMPDIR": "/scratch",
        "LANG": "C.UTF-8",
    }
    os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
    # -E -s: ignore PYTHON* variables and the user site; -B: no .pyc files.
    os.execve(python, [python, "-E", "-s", "-B", "main.py"], env)


def _init(config: dict, code: bytes, helpers: int) -> int:
    """Pid 1 of the sandbox. Returns only in the worker, on an exec failure."""
    status_fd = config["status_fd"]
    try:
        _build_root(config, code)
        _pivot_root()
        libc.sethostname(b"sandbox", 7)
        # The code may not create nested user namespaces: they would hand it capabilities (over
        # nothing of the host's, but over a large kernel surface). The limit is per namespace.
        if os.path.exists("/proc/sys/user/max_user_namespaces"):
            _write("/proc/sys/user/max_user_namespaces", "0")
    except (SetupError, OSError) as exc:
        _report(status_fd, {"error": f"sandbox setup: {exc}"})
        return 1
    worker = os.fork()
    if worker == 0:
        try:
            _exec_worker(config, helpers)
        except (SetupError, OSError) as exc:
            _report(status_fd, {"error": f"sandbox worker: {exc}"})
        return 127
    while True:  # as pid 1 we also inherit and reap the worker's orphans
        pid, status = os.waitpid(-1, 0)
        if pid == worker:
            break
    if os.WIFSIGNALED(status):
        _report(status_fd, {"signal": os.WTERMSIG(status)})
    else:
        _report(status_fd, {"exit_code": os.WEXITSTATUS(status)})
    return 0  # exiting kills every process still in the namespace


def _wait_until(pid: int, deadline: float) -> bool:
    """Wait for `pid` to end, killing it at `deadline` (time.monotonic()); True if it was killed.

    The child is only reaped after the timer is disarmed, so the kill can never hit a reused pid.
    """
    state = {"done": False, "killed": False}

    def on_alarm(signum, frame) -> None:
        if not state["done"]:
            state["killed"] = True
            os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    signal.setitimer(signal.ITIMER_REAL, 0)
    state["done"] = True
    os.waitpid(pid, 0)
    return state["killed"]


def _child(config: dict, code: bytes, helpers: int, unshared_w: int, mapped_r: int) -> int:
    """Enter the namespaces, wait for the parent to write the id maps, run init to the deadline."""
    status_fd = config["status_fd"]
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the launcher died: die too
    try:
        _unshare()
    except SetupError as exc:
        _report(status_fd, {"error": f"sandbox launcher: {exc}"})
        return 1
    os.write(unshared_w, b"u")
    if os.read(mapped_r, 1) != b"m":
        return 1  # the parent failed to map the ids and has reported why
    init = os.fork()
    if init == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        return _init(config, code, helpers)
    # Init's exit returns only once every process of its namespace is gone, so once this wait
    # is over nothing the code started is left running.
    if _wait_until(init, config["deadline"]):
        _report(status_fd, {"timeout": True})
    return 0


def _launch(config: dict, code: bytes) -> None:
    if os.geteuid() == 0:
        try:
            os.setgroups([])  # root's supplementary groups must not reach the code
        except OSError as exc:
            raise SetupError(f"dropping the supplementary groups failed: {exc}") from exc
    uid_map, gid_map, helpers = _id_maps()
    unshared_r, unshared_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    child = os.fork()
    if child == 0:
        os._exit(_child(config, code, helpers, unshared_w, mapped_r))
    os.close(unshared_w)
    try:
        if os.read(unshared_r, 1) == b"u":
            try:
                _map_ids(child, uid_map, gid_map)
            except OSError as exc:
                raise SetupError(f"writing the user namespace id maps failed: {exc}") from exc
            os.write(mapped_w, b"m")
    finally:
        os.close(mapped_w)
        os.waitpid(child, 0)


def main() -> int:
    config = json.loads(sys.stdin.buffer.readline())
    code = sys.stdin.buffer.read()
    try:
        _launch(config, code)
    except (SetupError, OSError) as exc:
        _report(config["status_fd"], {"error": f"sandbox launcher: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    os._exit(main())
