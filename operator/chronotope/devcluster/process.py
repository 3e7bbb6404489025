"""Start, watch and stop the control-plane processes.

Each component runs in its own session (process group) with stdout and stderr
in a log file, so it survives the command that started it (the demo cluster
keeps running after `chronotope dev cluster up` returns) and `down` can end it
together with anything it forked. A PID is only signalled while its
/proc/PID/cmdline still names the binary we started, so a stale state file
after a crash never kills an unrelated process that reused the PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ComponentError",
    "Started",
    "free_port",
    "is_alive",
    "kill",
    "port_is_free",
    "start",
    "stop",
    "tail",
    "wait_until",
]


class ComponentError(RuntimeError):
    """A component failed to start or become ready; the message carries its last log lines."""


@dataclass(frozen=True)
class Started:
    """A process started for a component: what identifies it, and where it logs."""

    name: str
    pid: int
    binary: str
    log: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, compare=False, repr=False)
    argv: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """The command line it was started with (so it can be started again the same way)."""

    def record(self) -> dict[str, object]:
        """What state.json keeps (everything but the live Popen handle)."""
        record: dict[str, object] = {
            "name": self.name,
            "pid": self.pid,
            "binary": self.binary,
            "log": str(self.log),
        }
        if self.argv:
            record["argv"] = list(self.argv)
        return record

    def alive(self) -> bool:
        """Whether the process still runs."""
        # Our own child: ask Popen (right after fork /proc still shows the parent's cmdline).
        if self.popen is not None:
            return self.popen.poll() is None
        return is_alive(self.pid, self.binary)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether `port` can be bound on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of the log at `path`, or "(no log)" if it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def start(name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Started:
    """Start `argv` in its own session, appending stdout and stderr to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    return Started(name=name, pid=proc.pid, binary=argv[0], log=log, popen=proc, argv=tuple(argv))


def is_alive(pid: int, binary: str) -> bool:
    """True while PID runs the binary we started (guards against PID reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ", 1)[1].startswith("Z"):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                return False
    except (OSError, IndexError):
        return False
    return cmdline.split(b"\0", 1)[0].decode(errors="replace") == binary


def stop(pid: int, binary: str, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it after `grace` seconds."""
    if not is_alive(pid, binary):
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if _signal_group(pid, binary, sig, wait):
            return


def kill(pid: int, binary: str) -> None:
    """SIGKILL the process group at once, as a crash would, and wait until it is gone."""
    if is_alive(pid, binary):
        _signal_group(pid, binary, signal.SIGKILL, 5.0)


def _signal_group(pid: int, binary: str, sig: signal.Signals, wait: float) -> bool:
    """Send `sig` to the process group; whether the process is gone within `wait` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not is_alive(pid, binary):
            return True
        time.sleep(0.1)
    return False


def wait_until(
    started: Started, ready: Callable[[], bool], timeout: float, what: str = "ready"
) -> None:
    """Poll `ready` until it holds; fail with the last log lines if it dies or stalls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not started.alive():
            raise ComponentError(
                f"{started.name} exited before it was {what}; last lines of {started.log}:\n"
                + tail(started.log)
            )
        try:
            if ready():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise ComponentError(
        f"{started.name} was not {what} within {timeout:.0f}s; last lines of {started.log}:\n"
        + tail(started.log)
    )
