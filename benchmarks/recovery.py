"""Scenario 5: recovering a large log: load time and peak memory, each load in a fresh process.

The log is generated directly in the JSONL format: complete turns of two steps (streamed
chunks, a tool call and its result), then an open turn that ends with a durable ``tool/call``
and a torn final line, so recovery does all of its work: it scans every line, cuts and keeps
the torn tail, and appends the closing repair.

Each measured load runs in a child process (``python -m benchmarks.recovery measure ...``) so
that its peak memory is its own. The child reports its peak resident set size twice: the
kernel's high-water mark of its address space (``VmHWM``, Linux) and ``ru_maxrss`` (which on
Linux also keeps the parent's resident size at the time of the fork, so it can only be larger).
A separate run reports the ``tracemalloc`` peak (Python allocations only; tracing slows the
load, so that run's time is not used).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING, Final, cast

import anyio
import msgspec

from kai_session_checkpoint_policy import TextBlock, ToolResult
from kai_session_checkpoint_policy.eventdata import tool_result
from kai_session_checkpoint_policy.events import encode_data
from kai_session_checkpoint_policy.persistence import (
    JsonlSessionPersistence,
    encode_session_id,
    interrupted_turn_closers,
)
from kai_session_checkpoint_policy.persistence.jsonl.format import (
    NO_CWD,
    compress_frame,
    encode_events,
    encode_header,
    log_name,
    scan_log,
)
from kai_session_checkpoint_policy.persistence.values import SessionHeader

from ._support import DEFAULT_FORMAT, FORMATS, summarize

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from kai_session_checkpoint_policy import JSONObject

__all__ = ["generate_log", "recovery"]

SESSION_ID: Final = "recovery"
CHUNKS_PER_STEP: Final = 40
START_MS: Final = 1_700_000_000_000


def _line(event_type: str, seq: int, time_ms: int, data: JSONObject) -> str:
    _, encoded = encode_data(event_type, data)
    return f'{{"type":"{event_type}","seq":{seq},"time":{time_ms},"data":{encoded}}}\n'


def _turn(turn: int, chunks: int, *, closed: bool) -> Iterator[tuple[str, JSONObject]]:
    """The events of one turn: step 1 streams and asks for a tool, step 2 streams and answers.

    An open turn (``closed=False``) stops right after step 1's ``tool/call``.
    """
    call_id = f"call-{turn}"
    yield "turn/start", {"turn": turn}
    yield "step/start", {"turn": turn, "step": 1}
    message: JSONObject = {
        "id": f"user-{turn}",
        "role": "user",
        "content": [{"type": "text", "text": f"Question number {turn}?"}],
        "source": {"kind": "prompt"},
    }
    yield "user/message", {"turn": turn, "step": 1, "message": message}
    for step in (1, 2):
        if step == 2:
            yield "step/start", {"turn": turn, "step": 2}
        for index in range(chunks if closed or step == 1 else 0):
            text = f"chunk {index:04d} of a streamed answer"
            chunk: JSONObject = {"type": "text-delta", "index": 0, "text": text}
            yield "assistant/chunk", {"turn": turn, "step": step, "chunk": chunk}
        content: list[JSONObject] = [{"type": "text", "text": "(streamed text)"}]
        if step == 1:
            content.append(
                {"type": "tool-call", "id": call_id, "name": "lookup", "arguments": "{}"}
            )
        reply: JSONObject = {
            "id": f"assistant-{turn}-{step}",
            "role": "assistant",
            "content": list(content),
            "source": {"kind": "model", "provider": "bench", "model": "scripted"},
        }
        yield "assistant/message", {"turn": turn, "step": step, "message": reply}
        if step == 1:
            yield (
                "tool/call",
                {
                    "turn": turn,
                    "step": 1,
                    "callId": call_id,
                    "name": "lookup",
                    "arguments": "{}",
                },
            )
            if not closed:
                return
            answer = ToolResult((TextBlock('{"answer": 42}'),))
            yield "tool/result", cast("JSONObject", tool_result(turn, 1, call_id, answer))
        yield "step/end", {"turn": turn, "step": step}
    yield "turn/end", {"turn": turn, "reason": {"kind": "completed"}}


def generate_log(path: Path, events: int) -> int:
    """Write a log of exactly *events* events (and a torn tail) to *path*; return its size."""
    closed_length = sum(1 for _ in _turn(1, CHUNKS_PER_STEP, closed=True))
    open_fixed = sum(1 for _ in _turn(1, 0, closed=False))
    if events < open_fixed:
        raise ValueError(f"a log needs at least {open_fixed} events")
    turns = (events - open_fixed) // closed_length
    seq = 0
    with path.open("wb") as log:
        log.write(encode_header(SessionHeader(SESSION_ID, START_MS)))
        plan = [(turn, CHUNKS_PER_STEP, True) for turn in range(1, turns + 1)]
        plan.append((turns + 1, events - turns * closed_length - open_fixed, False))
        for turn, chunks, closed in plan:
            lines = [
                _line(event_type, seq + index, START_MS + seq + index, data)
                for index, (event_type, data) in enumerate(_turn(turn, chunks, closed=closed))
            ]
            seq += len(lines)
            log.write("".join(lines).encode())
        log.write(b'{"type":"tool/result","seq":')  # the torn final line
    if seq != events:
        raise AssertionError(f"generated {seq} events instead of {events}")
    return path.stat().st_size


# -- the child: one load, measured ------------------------------------------------------------


def _maxrss_bytes() -> int:
    # Linux reports kilobytes, macOS bytes.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _hwm_bytes() -> int | None:
    """The peak resident size of this process's own address space (Linux only)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


async def _load(root: str, session_id: str) -> tuple[float, int, int, int]:
    """Load the session; return the seconds it took (the log still alive) and its counts."""
    backend = JsonlSessionPersistence(root)
    start = time.perf_counter()
    log = await backend.load(session_id)
    seconds = time.perf_counter() - start
    return seconds, len(log.events), len(log.repair), log.torn_bytes


def _measure(root: str, session_id: str, backend: str, trace: bool) -> dict[str, object]:
    before = _hwm_bytes()
    if trace:
        tracemalloc.start()
    seconds, events, repair, torn = anyio.run(_load, root, session_id, backend=backend)
    traced_peak = tracemalloc.get_traced_memory()[1] if trace else None
    return {
        "seconds": seconds,
        "hwm_bytes": _hwm_bytes(),
        "hwm_before_bytes": before,
        "maxrss_bytes": _maxrss_bytes(),
        "traced_peak_bytes": traced_peak,
        "events": events,
        "repair_events": repair,
        "torn_bytes": torn,
    }


# -- the parent ---------------------------------------------------------------------------------


BATCH: Final = 100
"""Events per batch of a converted log: about what a 200 ms window holds while streaming."""


def convert(pristine: Path, log_format: str) -> Path:
    """The log of *pristine* (plain lines) written again in *log_format*, with its torn tail.

    Batches of :data:`BATCH` events, each one frame if compressed (the torn tail is then a
    frame cut short).
    """
    compression, pack = FORMATS[log_format]
    target = pristine.with_name(f"{pristine.name}.{compression}.{'packed' if pack else 'lines'}")
    scan = scan_log(pristine.read_bytes(), pristine)
    with target.open("wb") as log:
        header = encode_header(scan.header)
        log.write(compress_frame(header) if compression == "zstd" else header)
        for start in range(0, len(scan.events), BATCH):
            batch = scan.events[start : start + BATCH]
            log.write(encode_events(batch, pack=pack, compression=compression))
        if scan.torn:
            log.write(compress_frame(scan.torn)[:-3] if compression == "zstd" else scan.torn)
    return target


def _fresh_copy(pristine: Path, root: Path, log_format: str) -> None:
    directory = root / NO_CWD / encode_session_id(SESSION_ID)
    if root.exists():
        shutil.rmtree(root)
    directory.mkdir(mode=0o700, parents=True)
    name = log_name(FORMATS[log_format][0])
    shutil.copyfile(pristine, directory / name)
    os.chmod(directory / name, 0o600)


def _child(*arguments: str, module: str = "benchmarks.recovery") -> dict[str, object]:
    """Run ``python -m <module> *arguments`` and return the JSON object it prints."""
    command = [sys.executable, "-m", module, *arguments]
    here = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")])),
    }
    output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    result: dict[str, object] = json.loads(output)
    return result


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"expected an integer from the child, not {value!r}")
    return value


def _float(value: object) -> float:
    if not isinstance(value, (int, float)):
        raise TypeError(f"expected a number from the child, not {value!r}")
    return float(value)


def decode_floor(path: Path) -> float:
    """Seconds that one ``json.loads`` call takes to decode all the events of *path* at once.

    The event lines are joined into one JSON array first (not timed), so this is the standard
    library's decoder alone, with no per-line overhead: the least a recovery in Python pays to
    turn the bytes into objects. The cyclic garbage collector is paused as recovery pauses it.
    """
    lines = path.read_bytes().split(b"\n")[1:-1]  # not the header, not the torn tail
    array = "[" + b",".join(lines).decode() + "]"
    del lines
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        decoded = json.loads(array)
        seconds = time.perf_counter() - start
        del decoded
    finally:
        if enabled:
            gc.enable()
    return seconds


class _Envelope(msgspec.Struct, gc=False):
    """An event as the compiled floor decodes it: its envelope, its data left raw."""

    type: str
    seq: int
    time: int
    data: msgspec.Raw


def compiled_floor(path: Path) -> dict[str, object]:
    """Read the plain log *path* and decode its event lines with one compiled decode into
    structs of the envelope and the raw data: the least a reader of the events pays in Python.

    The time includes reading the file, as a load's does; the peak is this process's.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        data = path.read_bytes()
        body = memoryview(data)[data.index(b"\n") + 1 : data.rindex(b"\n") + 1]
        decoded = msgspec.json.Decoder(_Envelope).decode_lines(body)
        seconds = time.perf_counter() - start
        count = len(decoded)
    finally:
        if enabled:
            gc.enable()
    return {"seconds": seconds, "hwm_bytes": _hwm_bytes(), "records": count}


def _loads(log: Path, root: Path, log_format: str, runs: int, backend: str) -> dict[str, object]:
    """Load a fresh copy of *log* *runs* times on *backend*; the figures of those loads."""
    loads = []
    for _ in range(runs):
        _fresh_copy(log, root, log_format)
        loads.append(_child("measure", str(root), SESSION_ID, "-b", backend))
    first = loads[0]
    return {
        "runs": runs,
        "load_seconds": summarize([_float(run["seconds"]) for run in loads], scale=1).to_json(),
        "maxrss_mib": summarize(
            [_int(run["maxrss_bytes"]) for run in loads], scale=2**-20
        ).to_json(),
        "peak_rss_mib": summarize(
            [_int(run["hwm_bytes"] or run["maxrss_bytes"]) for run in loads], scale=2**-20
        ).to_json(),
        "peak_rss_before_load_mib": round(
            _int(first["hwm_before_bytes"] or first["maxrss_bytes"]) / 2**20, 1
        ),
        "loaded_events": first["events"],
        "repair_events": first["repair_events"],
        "torn_bytes": first["torn_bytes"],
    }


def close_log(pristine: Path, closed: Path) -> None:
    """Write *pristine* again as recovery leaves it: its torn tail cut, its open turn closed."""
    scan = scan_log(pristine.read_bytes(), pristine)
    closers = interrupted_turn_closers(scan.events, tail_cut=True)
    with closed.open("wb") as log:
        log.write(encode_header(scan.header))
        for start in range(0, len(scan.events), BATCH):
            log.write(encode_events(scan.events[start : start + BATCH], pack=False))
        log.write(encode_events(closers, pack=False))


def recovery(directory: Path, events: int, runs: int, backends: Sequence[str]) -> dict[str, object]:
    """Generate a log of *events* events, then load it *runs* times per event loop and format
    (fresh copies), with its last turn open (and a torn tail) and closed.

    The figures of the default format with the turn open are also kept under each backend's
    name, for the targets. The floors are measured on the plain log, in the same run.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pristine = directory / "pristine.jsonl"
    closed = directory / "closed.jsonl"
    start = time.perf_counter()
    generate_log(pristine, events)
    close_log(pristine, closed)
    figures: dict[str, object] = {
        "events": events,
        "format": DEFAULT_FORMAT,
        "generate_seconds": round(time.perf_counter() - start, 3),
        "decode_floor_seconds": round(_float(_child("floor", str(pristine))["seconds"]), 3),
    }
    floors = [_child("compiled-floor", str(pristine)) for _ in range(runs)]
    figures["compiled_floor"] = {
        "load_seconds": summarize([_float(run["seconds"]) for run in floors], scale=1).to_json(),
        "peak_rss_mib": summarize(
            [_int(run["hwm_bytes"]) for run in floors], scale=2**-20
        ).to_json(),
    }
    root = directory / "root"
    formats: dict[str, object] = {}
    for log_format in FORMATS:
        per_state: dict[str, object] = {}
        for state, source in (("open", pristine), ("closed", closed)):
            log = convert(source, log_format)
            if state == "open":
                size = log.stat().st_size
                per_state |= {"file_bytes": size, "bytes_per_event": round(size / events, 1)}
            loads = {backend: _loads(log, root, log_format, runs, backend) for backend in backends}
            per_state[state] = loads
            if state == "open" and log_format == DEFAULT_FORMAT:
                figures |= loads
                figures["file_bytes"] = size
                _fresh_copy(log, root, log_format)  # memory does not depend on the event loop
                traced = _child("measure", str(root), SESSION_ID, "-b", backends[0], "-t")
                figures["tracemalloc_peak_mib"] = round(
                    _int(traced["traced_peak_bytes"]) / 2**20, 1
                )
                figures["tracemalloc_backend"] = backends[0]
            log.unlink()
        formats[log_format] = per_state
    figures["formats"] = formats
    shutil.rmtree(root, ignore_errors=True)
    pristine.unlink()
    closed.unlink()
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recovery")
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("measure", help="load one session and report time and memory")
    measure.add_argument("root")
    measure.add_argument("session")
    measure.add_argument("-b", "--backend", default="asyncio", choices=("asyncio", "trio"))
    measure.add_argument("-t", "--trace", action="store_true", help="measure with tracemalloc")
    floor = commands.add_parser("floor", help="time one json.loads of all the events of a log")
    floor.add_argument("log", type=Path)
    compiled = commands.add_parser(
        "compiled-floor", help="read a plain log and decode its events into raw-data structs"
    )
    compiled.add_argument("log", type=Path)
    args = parser.parse_args(argv)
    if args.command == "floor":
        print(json.dumps({"seconds": decode_floor(args.log)}))
    elif args.command == "compiled-floor":
        print(json.dumps(compiled_floor(args.log)))
    else:
        print(json.dumps(_measure(args.root, args.session, args.backend, args.trace)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
