"""A real engine in a child process, driven by JSON-line commands and stopped by PID: the
protocol both sides share (SGLang's ``engine_process`` / ``engines`` and vLLM's
``node_process`` / ``nodes``).

Owns the child's side (``start_engine``: build the engine and say so; ``serve``: the command
loop) and the parent's handle (``ChildProcess``): start, one command at a time with a timeout,
the log, stopping the whole process group. Must not know what an engine is.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPLY = "@@radixlink-node "
Handler = Callable[[dict[str, Any]], dict[str, Any]]
T = TypeVar("T")


class NodeError(RuntimeError):
    """A child failed to start or to answer; carries the tail of its log."""


def reply(payload: dict[str, Any]) -> None:
    """One reply line on stdout (the child's own logging shares stdout; the parent skips it)."""
    sys.stdout.write(REPLY + json.dumps(payload) + "\n")
    sys.stdout.flush()


def start_engine(build: Callable[[], T]) -> T | None:
    """The child's first step: ``build()`` the engine, then the first reply, ``{"ready": True,
    "load_s": seconds}``, or the failure (the parent raises it with the traceback): None."""
    began = time.perf_counter()
    try:
        engine = build()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        reply({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return None
    reply({"ready": True, "load_s": time.perf_counter() - began})
    return engine


def serve(handlers: dict[str, Handler]) -> None:
    """The child's loop: one JSON command per stdin line, ``{"op": name, ...}``, answered by
    ``handlers[name](cmd)``; ``exit`` ends it. A handler's exception is a reply, never a crash."""
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "exit":
            reply({"ok": True})
            return
        try:
            if op not in handlers:
                raise ValueError(f"unknown op {op!r}; known: {', '.join(sorted(handlers))}")
            reply(handlers[op](cmd))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
            reply({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})


class ChildProcess:
    """A started child (``python -m MODULE ARG``) that answered its first reply. ``close``
    stops it and its whole process group (engines spawn processes of their own).

    Args:
        module: the child's module, run with ``-m``.
        arg: its one argument (a JSON spec).
        log_path: where the child's own output goes (its tail goes into every ``NodeError``).
        env: the child's whole environment.
        python: the interpreter (default: this one).
        start_timeout_s: how long the first reply may take.
        what: the child's name in messages.
    """

    def __init__(self, module: str, arg: str, log_path: str | Path, *, env: dict[str, str],
                 python: str | None = None, start_timeout_s: float = 600.0,
                 what: str = "node"):  # fmt: skip
        self.log_path = Path(log_path)
        self.what = what
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(
            [python or sys.executable, "-m", module, arg], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True)
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.ready = self._wait(start_timeout_s, "start")
        except NodeError:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def call(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one command and wait for its reply.

        Raises:
            NodeError: the child exited, answered with an error, or not in time.
        """
        if self._proc.poll() is not None:
            raise NodeError(f"{self.what} {self.pid} has exited:\n{self.log_tail()}")
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        return self._wait(timeout_s, str(cmd.get("op")))

    def log_tail(self, num_lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the child to exit; past ``timeout_s``, kill its process group. Idempotent."""
        if self._proc.poll() is None:
            try:
                self.call({"op": "exit"}, timeout_s)
                self._proc.wait(timeout_s)
            except (NodeError, OSError, subprocess.TimeoutExpired):
                pass
        try:  # NOTE: the engine's own children share the group; make sure they are gone too
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()
        self._reader.join(5.0)
        self._log.close()

    def _wait(self, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        try:
            got = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise NodeError(f"{self.what} {self.pid}: no answer to {what} in {timeout_s} s:\n"
                            f"{self.log_tail()}") from None
        if got is None:
            raise NodeError(f"{self.what} {self.pid} exited during {what}:\n{self.log_tail()}")
        if got.get("usage"):  # NOTE: the child's environment is wrong: one line says the fix
            raise NodeError(str(got["error"]))
        if "error" in got:
            raise NodeError(f"{self.what} {self.pid}: {what} failed: {got['error']}\n"
                            f"{got.get('traceback', '')}\n{self.log_tail()}")
        return got

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(REPLY):
                self._replies.put(json.loads(line[len(REPLY):]))
            else:
                self._log.write(line)
        self._replies.put(None)
