"""The spaCy extraction process: ``graph.extract: spacy`` parses here, not in
the service, so a parse never holds the service's GIL (the event loop, the
outbox worker and every recall share that one lock; beside recalls, a
parse in a thread of the service delayed writes' acks and the outbox:
``benchmarks/results/write-mix-s43-{thread,process}.md``).

The service starts one per process (:class:`indexers.spacy_extractor.ExtractionProcess`)
and talks to it over its stdin and stdout, one call at a time: a frame is a
4-byte big-endian length and a msgpack body. The process loads the pipeline,
answers ``ready``, then answers each request (a list of ``[text, skip,
max_entities]``) with ``{"ok": [Extraction, ...]}`` in order, or
``{"error": "..."}`` when the parse raised. It ends when its stdin closes,
which is also what happens when the service dies; it ignores SIGINT.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
from typing import IO, Any

import msgspec

__all__ = ["main", "read_frame", "write_frame"]

_LENGTH = struct.Struct(">I")


def write_frame(out: IO[bytes], body: bytes) -> None:
    out.write(_LENGTH.pack(len(body)) + body)
    out.flush()


def read_frame(inp: IO[bytes]) -> bytes | None:
    """The next frame's body; None at the end of the stream (a frame cut short too)."""
    head = inp.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    body = inp.read(size)
    return body if len(body) == size else None


def main() -> None:
    from threadpoolctl import threadpool_limits

    from .spacy_extractor import _run, load_pipeline

    threadpool_limits(limits=1, user_api="blas")
    # Ctrl-C in a terminal reaches the whole process group: the service stops
    # on it, and this process ends when the service closes its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Frames go to the stdout the service reads; anything a library prints
    # goes to stderr instead of into a frame.
    inp, out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder(list[tuple[str, list[str], int]]).decode
    load_pipeline()
    write_frame(out, encode("ready"))
    while (body := read_frame(inp)) is not None:
        answer: Any
        try:
            items = [(text, frozenset(skip), most) for text, skip, most in decode(body)]
            answer = {"ok": _run(items)}
        except Exception as exc:  # the caller's to raise; the process goes on
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        write_frame(out, encode(answer))


if __name__ == "__main__":
    main()
