"""What the JSONL backend reads, refuses or reports in a root, as the original harness does.

One encoding per root, obsolete flat-file logs, header fields the original refuses, a second
header line, and an event a reader may skip whose data is not an object.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from kai_session_checkpoint_policy import Host
from kai_session_checkpoint_policy.events import StoredDataError
from kai_session_checkpoint_policy.persistence import (
    CorruptLogError,
    EncodingMismatchError,
    JsonlSessionPersistence,
    LogChangedError,
    OsFiles,
    UnsupportedFormatError,
)
from kai_session_checkpoint_policy.persistence.ids import NO_CWD, encode_session_id
from kai_session_checkpoint_policy.persistence.jsonl.format import compress_frame, scan_log

from ..support.persistence_helpers import COMPLETE_TURN, events, log_bytes, log_path, write_log

pytestmark = pytest.mark.anyio

HEADER = b'{"type":"session","version":0,"id":"s","createdAt":1,"delegationDepth":0}\n'
EVENT = b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}\n'


@pytest.mark.parametrize(("found", "written"), [("none", "zstd"), ("zstd", "none")])
async def test_a_new_session_in_the_other_encoding_is_refused_naming_the_log_found(
    tmp_path: Path, found: str, written: str
) -> None:
    stored = write_log(
        tmp_path,
        "old",
        log_bytes("old", events(*COMPLETE_TURN)),
        compression="zstd" if found == "zstd" else "none",
    )
    backend = JsonlSessionPersistence(tmp_path, compression="zstd" if written == "zstd" else "none")
    for _ in range(2):  # refused every time, nothing created
        with pytest.raises(EncodingMismatchError) as refused:
            await backend.write_log("new", events(*COMPLETE_TURN))
        assert not (tmp_path / NO_CWD / "new").exists()
    kind = "compressed" if found == "zstd" else "plain"
    assert str(refused.value) == (
        f"{stored} is a {kind} log, and this backend writes compression {written!r}: a root "
        "holds logs in one encoding (the original harness refuses a root with both); use "
        "another root, or the compression of the logs it holds"
    )
    # The logs it holds are read, and written, in their own encoding.
    assert len((await backend.load("old")).events) == 6


async def test_a_root_of_one_encoding_takes_new_sessions(tmp_path: Path) -> None:
    write_log(tmp_path, "old", log_bytes("old", events(*COMPLETE_TURN)), compression="zstd")
    async with Host([JsonlSessionPersistence(tmp_path)]) as host:
        session = host.sessions.create("new")
        session.append("turn/start", {"turn": 1})
        await host.sessions.flush(session)
    assert log_path(tmp_path, "new", "zstd").exists()


async def test_an_obsolete_flat_file_log_is_reported_not_skipped(tmp_path: Path) -> None:
    write_log(tmp_path, "kept", log_bytes("kept", events(*COMPLETE_TURN)))
    flat = tmp_path / NO_CWD / f"{encode_session_id('flat')}.jsonl"
    flat.write_bytes(log_bytes("flat", events(*COMPLETE_TURN)))
    backend = JsonlSessionPersistence(tmp_path, compression="none")

    listing = await backend.scan_sessions()

    assert [header.id for header in listing.headers] == ["kept"]
    assert [problem.directory for problem in listing.problems] == [flat]
    problem = listing.problems[0].error
    assert isinstance(problem, UnsupportedFormatError)
    assert str(problem) == (
        f"{flat} is a session log in the obsolete flat-file layout (<project>/<id>.jsonl); a log "
        "is read only from its session's directory (<project>/<id>/session.jsonl): move it "
        "there, or use another root"
    )
    with pytest.raises(UnsupportedFormatError, match="obsolete flat-file layout"):
        backend.session_exists("flat")
    with pytest.raises(UnsupportedFormatError, match="obsolete flat-file layout"):
        await backend.inspect("flat")


@pytest.mark.parametrize("field", ["createdAt", "delegationDepth"])
def test_negative_zero_in_the_header_is_refused(field: str) -> None:
    header = HEADER.replace(
        f'"{field}":'.encode() + (b"1" if field == "createdAt" else b"0"), f'"{field}":-0'.encode()
    )
    assert b"-0" in header
    with pytest.raises(CorruptLogError, match=rf"line 1: the header's {field} is not "):
        scan_log(header + EVENT, Path("/logs/session.jsonl"))


def test_a_second_header_line_is_damage() -> None:
    with pytest.raises(CorruptLogError) as refused:
        scan_log(HEADER + EVENT + HEADER, Path("/logs/session.jsonl"))
    assert str(refused.value) == (
        "corrupt session log /logs/session.jsonl, line 3: a second session header: a log has "
        "one, on its first line"
    )


def test_an_ignorable_event_of_an_unknown_type_with_null_data_is_read_and_skipped() -> None:
    skipped = b'{"type":"x/later","seq":1,"time":2,"data":null,"ignorable":true}\n'
    listed = b'{"type":"x/later","seq":2,"time":3,"data":[1,2],"ignorable":true}\n'
    scan = scan_log(HEADER + EVENT + skipped + listed, Path("/logs/session.jsonl"))
    assert [(event.type, event.data, event.ignorable) for event in scan.events] == [
        ("turn/start", {"turn": 1}, False),
        ("x/later", {}, True),
        ("x/later", {}, True),
    ]
    # An event of a known type is read: its data must be an object, checked when first read.
    known = b'{"type":"turn/end","seq":1,"time":2,"data":null,"ignorable":true}\n'
    read = scan_log(HEADER + EVENT + known, Path("/logs/session.jsonl")).events[1]
    with pytest.raises(StoredDataError, match=r"not a JSON object"):
        _ = read.data


class AppendingFiles(OsFiles):
    """Real files where another writer appends a batch while each of the next reads runs."""

    def __init__(self, log: Path, batches: list[bytes]) -> None:
        super().__init__()
        self.log, self.batches, self.reads = log, batches, 0

    @contextlib.contextmanager
    def reader(self, path: Path) -> Iterator[Callable[[int], bytes]]:
        self.reads += 1
        with super().reader(path) as read:
            if self.batches:
                with self.log.open("ab") as log:  # the other writer's append, mid-read
                    log.write(self.batches.pop(0))
            yield read


def appended(first: int, count: int) -> list[bytes]:
    return [
        (f'{{"type":"note","seq":{seq},"time":{seq},"data":{{}},"ignorable":true}}\n').encode()
        for seq in range(first, first + count)
    ]


async def test_a_read_is_made_again_until_the_revision_before_and_after_agree(
    tmp_path: Path,
) -> None:
    path = write_log(tmp_path, "s", log_bytes("s", events(*COMPLETE_TURN)))
    files = AppendingFiles(path, appended(6, 2))
    backend = JsonlSessionPersistence(tmp_path, compression="none", files=files)

    suffix = await backend.read_from("s", 5)

    assert files.reads == 3  # two reads overlapped an append; the third did not
    assert [event.seq for event in suffix.events] == [5, 6, 7]
    assert suffix.revision == files.revision(path) == await backend.revision("s")


async def test_a_log_that_changes_during_every_read_is_refused(tmp_path: Path) -> None:
    path = write_log(tmp_path, "s", log_bytes("s", events(*COMPLETE_TURN)))
    files = AppendingFiles(path, appended(6, 16))
    backend = JsonlSessionPersistence(tmp_path, compression="none", files=files)
    with pytest.raises(LogChangedError) as refused:
        await backend.inspect("s")
    assert str(refused.value) == (
        f"{path} changed during each of 16 reads of it; another process keeps writing it"
    )
    assert files.reads == 16


class HeldHeads(OsFiles):
    """Real files whose header reads wait, the first time, until :attr:`release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def read_head(self, path: Path, limit: int = 1 << 16) -> bytes:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(10), "never released"
        return super().read_head(path, limit)


async def cancel_once_reading(files: HeldHeads, scope: anyio.CancelScope) -> None:
    await anyio.to_thread.run_sync(files.entered.wait)
    scope.cancel()
    files.release.set()


@pytest.mark.parametrize("name", ["list_sessions", "list_snapshots", "scan_sessions"])
async def test_a_listing_cancelled_while_it_reads_returns_nothing(
    tmp_path: Path, name: str
) -> None:
    write_log(tmp_path, "s", log_bytes("s", events(*COMPLETE_TURN)))
    files = HeldHeads()
    backend = JsonlSessionPersistence(tmp_path, files=files)
    returned: list[object] = []
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(cancel_once_reading, files, scope)
            returned.append(await getattr(backend, name)())
    assert scope.cancelled_caught
    assert returned == []
    assert files.release.is_set()


async def test_read_raw_of_a_compressed_log_is_its_text_as_written(tmp_path: Path) -> None:
    text = log_bytes("s", events(*COMPLETE_TURN))
    path = write_log(tmp_path, "s", text, compression="zstd")
    backend = JsonlSessionPersistence(tmp_path)
    artifact = await backend.read_raw("s")
    assert artifact is not None
    assert (artifact.filename, artifact.content) == ("session.jsonl", text)
    assert backend.locate("s").path == str(path)
    with path.open("ab") as log:  # a torn final frame: its complete blocks' text, as salvaged
        log.write(
            compress_frame(b'{"type":"turn/start","seq":6,"time":7,"data":{"turn":2}}\n')[:-4]
        )
    torn = await backend.read_raw("s")
    assert torn is not None
    assert torn.content.startswith(text)
