"""``braid ingest FILE.jsonl``: load memories from a JSON Lines file, resumably.

Each line is one memory object with the fields of ``POST /v1/memories``
items. Lines go in batches, each written in one transaction by the service
(all of it or none of it).

**No duplicates, however it stops.** A line without an ``id`` is sent with
one made from its line number and its bytes (``ingest-`` + 32 hex digits of
their SHA-256), and a write with ids replaces. So sending a line again — a
batch the service committed just before Ctrl-C, before the checkpoint
recorded it; a whole file run again — rewrites the same memory, never adds a
second one. (A line's ``mem_key`` then retires nothing new: the memory it
would retire is itself.) A line with its own ``id`` keeps it; a later line
with the same ``id`` replaces the earlier one, as on the API.

**Resuming.** After each committed batch the checkpoint (``FILE.braid-ingest``
beside the file, or ``--state``) records how far the file is done, the
SHA-256 of that part, and the service and key it went to. A re-run continues
after the last recorded batch; when the file's done part changed, or the
run goes to another service or key, it stops and says so (``--restart``
starts from line 1, harmlessly: see above). Lines appended later are picked
up by the next run.

**Bad lines** — not JSON, not an object, or refused by the service's
validation (the service names the batch item; the CLI takes it out and sends
the rest again) — are reported with their line numbers and skipped; the
exit status is then 1. A batch over the service's body size limit is split.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from ..client import DEFAULT_URL, Client
from ..errors import BadRequest, PayloadTooLarge
from ._common import AGENT_KEY, URL, app, connect, err, fail, reporting

__all__ = ["Checkpoint", "Ingest", "ingest", "line_id"]

#: Bytes of lines per request at most (the service refuses bodies over
#: ``server.maxBodyBytes``, 4 MiB by default).
MAX_BATCH_BYTES = 3 * 1024 * 1024
#: Bad line numbers kept in the checkpoint (the count is always whole).
KEPT_BAD = 1000
_ITEM = re.compile(r"^memories\[(\d+)\](?:\.|: )?")


def line_id(number: int, raw: bytes) -> str:
    """The id a line without one is written with: stable across runs."""
    return "ingest-" + hashlib.sha256(b"%d\n" % number + raw.strip()).hexdigest()[:32]


class Checkpoint(msgspec.Struct, kw_only=True):
    """How far a file is ingested (the state file's content)."""

    version: int = 1
    file: str
    #: SHA-256 of the service URL and key the lines went to (never the key itself).
    target: str
    #: Bytes of the file done (whole lines): committed, skipped or blank.
    offset: int = 0
    #: Lines done.
    lines: int = 0
    #: SHA-256 of the file's first ``offset`` bytes.
    done_sha256: str = hashlib.sha256(b"").hexdigest()
    #: Memories written, over every run.
    written: int = 0
    #: Bad lines skipped, over every run, and the first of their numbers.
    bad: int = 0
    bad_lines: list[int] = []

    def save(self, path: Path) -> None:
        """Write atomically: a crash leaves the old checkpoint or the new one."""
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode(self)) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


@dataclass
class Line:
    number: int
    raw: bytes
    memory: dict[str, Any]


@dataclass
class Batch:
    lines: list[Line] = field(default_factory=list)
    size: int = 0
    ids: set[str] = field(default_factory=set)
    #: Every line the batch covers, bad and blank ones included: the part of
    #: the file the checkpoint moves past once the batch is committed.
    raw: list[bytes] = field(default_factory=list)
    #: Numbers of the bad lines among them.
    bad: list[int] = field(default_factory=list)


class RateColumn(ProgressColumn):
    """Lines a second, from rich's own speed estimate."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f} lines/s", style="progress.data.speed")


def target_digest(url: str, key: str) -> str:
    return hashlib.sha256(f"{url}\n{key}".encode()).hexdigest()


def count_lines(path: Path) -> int:
    lines = 0
    last = b"\n"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


class Ingest:
    """One run over a file: reads lines after the checkpoint, writes batches,
    saves the checkpoint after each. :meth:`run` may be interrupted anywhere."""

    def __init__(self, client: Client, path: Path, state: Path, cp: Checkpoint, batch: int) -> None:
        self.client, self.path, self.state, self.cp = client, path, state, cp
        self.batch_size = batch
        #: Where progress and bad lines are shown (set by the command).
        self.progress = Progress(console=err, disable=True)
        self.written_now = 0
        self.bad_now = 0
        self._hash = hashlib.sha256()

    def resume_point(self) -> None:
        """Check the checkpoint still describes the file's start (and rebuild its hash)."""
        if self.cp.offset == 0:
            return
        remaining = self.cp.offset
        with self.path.open("rb") as f:
            while remaining > 0 and (chunk := f.read(min(remaining, 1 << 20))):
                self._hash.update(chunk)
                remaining -= len(chunk)
        if remaining or self._hash.hexdigest() != self.cp.done_sha256:
            fail(
                f"{self.path} changed in its first {self.cp.lines} lines since the checkpoint {self.state} "
                "was written; pass --restart to ingest it from line 1 (lines already in are rewritten, not duplicated)"
            )

    def lines(self) -> Iterator[tuple[int, bytes]]:
        with self.path.open("rb") as f:
            f.seek(self.cp.offset)
            number = self.cp.lines
            for raw in f:
                number += 1
                yield number, raw

    def run(self, task: Any) -> None:
        batch = Batch()
        for number, raw in self.lines():
            memory = self._parse(batch, number, raw)
            if memory is not None:
                mid = memory["id"]
                if mid in batch.ids or len(batch.lines) >= self.batch_size or batch.size + len(raw) > MAX_BATCH_BYTES:
                    self._commit(batch, task)
                    batch = Batch()
                batch.lines.append(Line(number, raw, memory))
                batch.size += len(raw)
                batch.ids.add(mid)
            batch.raw.append(raw)
        self._commit(batch, task)

    def _parse(self, batch: Batch, number: int, raw: bytes) -> dict[str, Any] | None:
        if not raw.strip():
            return None
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            self._bad(batch, number, f"invalid JSON: {exc}")
            return None
        if not isinstance(value, dict):
            self._bad(batch, number, f"not a JSON object (a memory) but {_kind(value)}")
            return None
        if value.get("id") is None:
            value["id"] = line_id(number, raw)
        if not isinstance(value["id"], str):
            self._bad(batch, number, f"id must be a string, not {_kind(value['id'])}")
            return None
        return value

    def _bad(self, batch: Batch, number: int, message: str) -> None:
        """Report a bad line now; the checkpoint counts it once its batch is done."""
        batch.bad.append(number)
        self.progress.console.print(f"[yellow]line {number}:[/] {escape(message)}")

    def _commit(self, batch: Batch, task: Any) -> None:
        if not batch.raw:
            return
        written = self._write(batch, batch.lines) if batch.lines else 0
        # Only now, after the service committed, does the checkpoint move on.
        for raw in batch.raw:
            self._hash.update(raw)
            self.cp.offset += len(raw)
        self.cp.lines += len(batch.raw)
        self.cp.written += written
        self.cp.bad += len(batch.bad)
        self.cp.bad_lines += sorted(batch.bad)[: max(0, KEPT_BAD - len(self.cp.bad_lines))]
        self.cp.done_sha256 = self._hash.hexdigest()
        self.cp.save(self.state)
        self.written_now += written
        self.bad_now += len(batch.bad)
        self.progress.update(task, advance=len(batch.raw))

    def _write(self, batch: Batch, lines: list[Line]) -> int:
        """Write ``lines``; take out the ones the service refuses, reporting
        them, and write the rest. The number written."""
        pending = [lines]
        written = 0
        while pending:
            part = pending.pop()
            try:
                self.client.remember([line.memory for line in part])
                written += len(part)
            except BadRequest as exc:
                match = _ITEM.match(exc.detail)
                index = int(match.group(1)) if match else None
                if match and index is not None and index < len(part):
                    self._bad(batch, part[index].number, exc.detail[match.end() :])
                    rest = part[:index] + part[index + 1 :]
                elif len(part) == 1:
                    self._bad(batch, part[0].number, exc.detail)
                    rest = []
                else:  # the service named no item: halve until it does
                    half = len(part) // 2
                    pending += [part[half:], part[:half]]
                    continue
                if rest:
                    pending.append(rest)
            except PayloadTooLarge as exc:
                if len(part) == 1:
                    self._bad(batch, part[0].number, f"larger than the service accepts: {exc.detail}")
                else:
                    half = len(part) // 2
                    pending += [part[half:], part[:half]]
        return written


def _kind(value: Any) -> str:
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


@app.command(rich_help_panel="Memory")
def ingest(
    file: Annotated[Path, typer.Argument(help="JSON Lines: one memory object per line.", exists=True, dir_okay=False)],
    batch: Annotated[int, typer.Option(help="Lines per request.", min=1, max=10_000)] = 128,
    state: Annotated[
        Path | None, typer.Option(help="Checkpoint file (default: FILE.braid-ingest beside it).", dir_okay=False)
    ] = None,
    restart: Annotated[bool, typer.Option(help="Ignore the checkpoint and start from line 1.")] = False,
    url: URL = DEFAULT_URL,
    key: AGENT_KEY = None,
) -> None:
    """Load memories from a JSON Lines file, in batches, with a progress bar.
    Ctrl-C stops it; the same command again continues where it stopped, and
    never writes a line twice. Bad lines are reported by number and skipped
    (exit status 1)."""
    state = state or file.with_name(file.name + ".braid-ingest")
    with reporting(url), connect(url, key, timeout=120.0) as client:
        target = target_digest(client.url, key or "")
        cp = _checkpoint(file, state, target, restart)
        total = count_lines(file)
        first = cp.lines
        if cp.lines:
            err.print(f"resuming {file} at line {cp.lines + 1} of {total} (checkpoint {state})")
        columns = (
            TextColumn("ingest"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("lines"),
            RateColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        started = time.monotonic()
        run = Ingest(client, file, state, cp, batch)
        run.resume_point()
        with Progress(*columns, console=err) as progress:
            run.progress = progress
            task = progress.add_task("ingest", total=max(total, cp.lines), completed=cp.lines)
            try:
                run.run(task)
            except KeyboardInterrupt:
                progress.stop()
                err.print(
                    f"interrupted: {cp.lines} of {total} lines done, {run.written_now} memories written in this run; "
                    f"run the same command again to continue (checkpoint {state})"
                )
                raise typer.Exit(130) from None
    took = time.monotonic() - started
    rate = (cp.lines - first) / took if took > 0 else 0.0
    err.print(
        f"{file}: {cp.lines} lines done, {run.written_now} memories written in this run "
        f"({cp.written} in all), {cp.bad} bad lines skipped in all, {took:.1f} s, {rate:,.0f} lines/s"
    )
    if cp.bad:
        shown = ", ".join(map(str, cp.bad_lines[:20])) + (" ..." if cp.bad > 20 else "")
        err.print(f"[yellow]bad lines: {shown}[/]")
        raise typer.Exit(1)


def _checkpoint(file: Path, state: Path, target: str, restart: bool) -> Checkpoint:
    fresh = Checkpoint(file=str(file.resolve()), target=target)
    if restart or not state.exists():
        return fresh
    try:
        cp = msgspec.json.decode(state.read_bytes(), type=Checkpoint)
    except (msgspec.DecodeError, OSError) as exc:
        fail(f"cannot read the checkpoint {state}: {exc}; pass --restart to start from line 1")
    if cp.target != target:
        fail(
            f"the checkpoint {state} is of a run to another service or key; pass --restart to "
            "ingest this file there from line 1, or --state for a separate checkpoint"
        )
    return cp
