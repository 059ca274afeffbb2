"""The log format: id escaping, the header, and how a log is scanned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_session_checkpoint_policy.events import (
    JSONObject,
    SessionEvent,
    StoredDataError,
    SurfaceReplace,
)
from kai_session_checkpoint_policy.persistence import (
    CorruptLogError,
    InvalidSessionIdError,
    UnsupportedFormatError,
    decode_event,
    decode_session_id,
    encode_session_id,
)
from kai_session_checkpoint_policy.persistence.ids import project_directory
from kai_session_checkpoint_policy.persistence.jsonl.format import encode_header, scan_log
from kai_session_checkpoint_policy.persistence.records import MAX_TIME
from kai_session_checkpoint_policy.persistence.values import SessionHeader

from ..support.persistence_helpers import COMPLETE_TURN, events, log_bytes

PATH = Path("root/s/session.jsonl")


@pytest.mark.parametrize(
    ("session_id", "escaped"),
    [  # the original harness's own examples
        ("interop", "interop"),
        ("semantic-checkpoint-crash", "semantic-checkpoint-crash"),
        ("a b/ü", "a~0020b~002F~00FC"),
        ("a~b", "a~007Eb"),
        ("/etc/passwd", "~002Fetc~002Fpasswd"),
        ("a\x00b", "a~0000b"),
        (".", "~002E"),
        ("..", "~002E~002E"),
        ("...", "..."),
        ("../etc", "..~002Fetc"),
        ("a/b\\c", "a~002Fb~005Cc"),
        ("😀", "~D83D~DE00"),
        ("\ud800", "~D800"),
        ("plain-ID_1.2", "plain-ID_1.2"),
        ("会话", "~4F1A~8BDD"),
    ],
)
def test_ids_become_one_safe_directory_name(session_id: str, escaped: str) -> None:
    assert encode_session_id(session_id) == escaped
    assert "/" not in escaped
    assert escaped not in {".", ".."}
    assert decode_session_id(escaped) == session_id


@pytest.mark.parametrize(
    ("cwd", "directory"),
    [  # the original harness's own examples
        (None, "_no-cwd"),
        ("/home/dev/payments-app", "--home-dev-payments-app--"),
        ("/Users/qyj/work/deepseek-harness", "--Users-qyj-work-deepseek-harness--"),
        ("C:\\work\\agent", "--C-work-agent--"),
        ("/开发/~agent", "--~5F00~53D1-~007Eagent--"),
        ("/", "--root--"),
        ("//a//b/", "--a-b---"),
        ("/a-/b", "--a--b--"),
        ("/tmp/My Project (v2)", "--tmp-My~0020Project~0020~0028v2~0029--"),
        ("/" + "x" * 1000, "--" + "x" * 251 + "--"),
    ],
)
def test_a_working_directory_becomes_a_project_directory(cwd: str | None, directory: str) -> None:
    assert project_directory(cwd) == directory


@given(st.text(min_size=1, max_size=25))  # at most 10 bytes per character: 250 bytes
def test_escaping_is_injective(session_id: str) -> None:
    escaped = encode_session_id(session_id)
    assert decode_session_id(escaped) == session_id
    assert Path(escaped).name == escaped
    assert escaped not in {".", ".."}


def test_unusable_ids_are_refused_with_a_reason() -> None:
    with pytest.raises(InvalidSessionIdError, match="must be a non-empty string, not ''"):
        encode_session_id("")
    with pytest.raises(
        InvalidSessionIdError, match=r"too long: 3000 bytes once escaped, at most 255"
    ):
        encode_session_id("x" * 3000)
    with pytest.raises(InvalidSessionIdError, match="a working directory must be a non-empty"):
        project_directory("")


def test_header_layout() -> None:
    assert encode_header(SessionHeader("s/1", 5)) == (
        b'{"type":"session","version":0,"id":"s/1","createdAt":5,"delegationDepth":0}\n'
    )
    header = SessionHeader("s", 5, cwd="/w", parent_session="p", seed_length=3, agent_preset="a")
    assert encode_header(header) == (
        b'{"type":"session","version":0,"id":"s","createdAt":5,"cwd":"/w","parentSession":"p",'
        b'"seedLength":3,"delegationDepth":0,"agentPreset":"a"}\n'
    )
    assert scan_log(encode_header(header), PATH).header == header


def test_event_line_layout() -> None:
    (first,) = events(("turn/start", {"turn": 1}))
    assert first.encode() == '{"type":"turn/start","seq":0,"time":1700000000000,"data":{"turn":1}}'
    live = SessionEvent("tool/result", 3, 1, {}, None, "append", (2,))
    assert live.encode() == (
        '{"type":"tool/result","seq":3,"time":1,"data":{},"sourceEventSeqs":[2],"surfaceOp":"append"}'
    )
    closer = live.replace(surface_op_first=True, ignorable=True)
    assert closer.encode() == (
        '{"type":"tool/result","seq":3,"time":1,"data":{},"surfaceOp":"append",'
        '"sourceEventSeqs":[2],"ignorable":true}'
    )
    replaced = SessionEvent("user/message", 5, 1, {}, None, SurfaceReplace(1, 4))
    assert replaced.encode().endswith(',"surfaceOp":{"op":"replace","start":1,"end":4}}')
    for event in (first, live, closer, replaced):
        assert json.loads(event.encode()) == event.to_json()
        assert decode_event(event.encode(), event.seq) == event


def test_scan_reads_every_committed_event() -> None:
    logged = events(*COMPLETE_TURN)
    scan = scan_log(log_bytes("s", logged), PATH)
    assert scan.header == SessionHeader("s", 1_700_000_000_000)
    assert scan.events == tuple(logged)
    assert scan.torn == b""


def test_a_final_line_without_newline_is_a_torn_tail() -> None:
    data = log_bytes("s", events(*COMPLETE_TURN))
    scan = scan_log(data + b'{"type":"assistant/ch', PATH)
    assert len(scan.events) == 6
    assert scan.committed_bytes == len(data)
    assert scan.torn == b'{"type":"assistant/ch'


OPEN_TURN: list[tuple[str, JSONObject]] = [
    *COMPLETE_TURN,
    ("turn/start", {"turn": 2}),
    ("step/start", {"turn": 2, "step": 1}),
]


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00\x00garbage\n",
        b"\x00" * 300 + b"\n" + b"\x00" * 100,
        b'{"type":"assistant/chunk","se\x00\x00\n\xff\n{"type":"tool/ca',
        b"[1,2\n7\n",  # not objects, so not records
    ],
)
def test_trailing_lines_none_of_them_a_record_are_a_torn_tail(tail: bytes) -> None:
    data = log_bytes("s", events(*OPEN_TURN))
    scan = scan_log(data + tail, PATH)
    assert len(scan.events) == 8
    assert (scan.committed_bytes, scan.torn) == (len(data), tail)


def test_a_damaged_line_in_an_open_turn_followed_by_a_record_is_corruption() -> None:
    """No turn/end follows the damage, yet the events after it are complete: never cut."""
    logged = events(*OPEN_TURN, ("assistant/chunk", {"turn": 2}), ("tool/call", {"turn": 2}))
    body = log_bytes("s", logged).splitlines(keepends=True)
    body[9] = b"\x00\x00garbage\n"  # the chunk (seq 8); the tool/call follows it
    with pytest.raises(CorruptLogError) as caught:
        scan_log(b"".join(body), PATH)
    assert (caught.value.path, caught.value.line) == (PATH, 10)
    assert caught.value.problem == (
        "not valid JSON (Expecting value: line 1 column 1 (char 0)); line 11 after it is a "
        "complete record, so this is not a torn tail"
    )


def test_damage_followed_by_a_record_of_another_shape_names_the_damage() -> None:
    data = log_bytes("s", events(*OPEN_TURN))
    tail = b"\x00garbage\n\x00\n" + b'{"type":"step/end","seq":99,"time":1,"data":{}}\n'
    with pytest.raises(CorruptLogError, match=r"line 10: not valid JSON .*line 12 after it is"):
        scan_log(data + tail, PATH)


DEEP = "[" * 65 + "]" * 65
SHAPES = {
    "an extra key": (
        b'{"type":"plan/mode","seq":8,"time":1,"data":{},"extra":1}',
        "not an event envelope",
    ),
    "a missing key": (b'{"type":"plan/mode","seq":8,"data":{}}', "not an event envelope"),
    "a seq as a string": (
        b'{"type":"plan/mode","seq":"8","time":1,"data":{}}',
        "seq is not an integer",
    ),
    "a type that is not a string": (b'{"type":8,"seq":8,"time":1,"data":{}}', "the event type"),
    "a seq out of order": (
        b'{"type":"plan/mode","seq":9,"time":1,"data":{}}',
        "seq 9 where 8 was",
    ),
    "a repeated seq": (b'{"type":"plan/mode","seq":7,"time":1,"data":{}}', "seq 7 where 8 was"),
    "NaN": (
        b'{"type":"plan/mode","seq":8,"time":1,"data":{"v":NaN}}',
        "NaN is not a finite number",
    ),
    "-Infinity": (
        b'{"type":"plan/mode","seq":8,"time":1,"data":{"v":-Infinity}}',
        "-Infinity is not",
    ),
    "a negative time": (
        b'{"type":"plan/mode","seq":8,"time":-1,"data":{}}',
        "the event time is not an",
    ),
    "a time after the year 9999": (
        b'{"type":"plan/mode","seq":8,"time":253402300800000,"data":{}}',
        "the event time is not an integer from 0 to 253402300799999",
    ),
    "a time of 10**30": (
        b'{"type":"plan/mode","seq":8,"time":%d,"data":{}}' % 10**30,
        "the event time is not an integer from 0 to 253402300799999",
    ),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("last", [True, False], ids=["last line", "before more events"])
def test_a_complete_record_of_an_unexpected_shape_is_corruption_anywhere(
    shape: str, last: bool
) -> None:
    """Such a line was written whole; cutting it could cut a durable tool/call."""
    line, problem = SHAPES[shape]
    data = log_bytes("s", events(*OPEN_TURN)) + line + b"\n"
    if not last:
        data += b'{"type":"x","seq":9,"time":1,"data":{}}\n'
    with pytest.raises(CorruptLogError) as caught:
        scan_log(data, PATH)
    assert caught.value.line == 10
    assert problem in caught.value.problem
    assert "torn tail" not in caught.value.problem


DATA_PROBLEMS = {
    "not an object": (b"[]", "not a JSON object"),
    "1e999": (b'{"v":1e999}', "1e999 is not a finite number"),
    "-1e999": (b'{"v":-1e999}', "-1e999 is not a finite number"),
    "a 400-digit float": (
        b'{"v":1%s.0}' % (b"0" * 400),
        "1%s.0 is not a finite number" % ("0" * 400),
    ),
    "nested 65 levels": (b'{"v":%s}' % DEEP[1:-1].encode(), "nested deeper than 64 levels"),
    "not UTF-8": (b'{"v":"\xff"}', "not UTF-8 (invalid start byte at byte 6)"),
}


@pytest.mark.parametrize("problem", DATA_PROBLEMS)
@pytest.mark.parametrize("last", [True, False], ids=["last line", "before more events"])
def test_data_that_is_not_lossless_json_is_refused_when_first_read(
    problem: str, last: bool
) -> None:
    """A log's envelopes are checked as it is read, each event's data when it is first read:
    the record is kept (it was written whole), and reading its data names what is wrong."""
    data_bytes, message = DATA_PROBLEMS[problem]
    data = log_bytes("s", events(*COMPLETE_TURN))
    data += b'{"type":"plan/mode","seq":%d,"time":1,"data":%s}\n' % (len(COMPLETE_TURN), data_bytes)
    if not last:
        data += b'{"type":"x","seq":%d,"time":1,"data":{},"ignorable":true}\n' % (
            len(COMPLETE_TURN) + 1
        )
    scan = scan_log(data, PATH)
    assert (len(scan.events), scan.torn) == (len(COMPLETE_TURN) + 1 + (not last), b"")
    damaged = scan.events[len(COMPLETE_TURN)]
    assert (damaged.type, damaged.seq, damaged.time) == ("plan/mode", len(COMPLETE_TURN), 1)
    for _ in range(2):  # the same error each time, nothing kept half-decoded
        with pytest.raises(StoredDataError) as caught:
            _ = damaged.data
        assert (caught.value.event_type, caught.value.seq) == ("plan/mode", len(COMPLETE_TURN))
        assert str(caught.value) == (
            f"the data of the stored 'plan/mode' event (seq {len(COMPLETE_TURN)}): {message}"
        )
    assert [event.data for event in scan.events[: len(COMPLETE_TURN)]] == [
        event.data for event in events(*COMPLETE_TURN)
    ]


def test_the_bounds_themselves_are_read() -> None:
    deepest = "[" * 63 + "]" * 63  # inside {"v": ...} inside the data: 64 levels
    line = f'{{"type":"x","seq":0,"time":{MAX_TIME},"data":{{"v":{deepest}}}}}\n'
    header = b'{"format":"kai-session","version":1,"id":"s","createdAt":%d}\n' % MAX_TIME
    scan = scan_log(header + line.encode(), PATH)
    assert scan.header.created_at == scan.events[0].time == MAX_TIME
    assert scan.events[0].data == json.loads(line)["data"]
    assert scan.torn == b""


def test_a_damaged_line_before_a_turn_end_is_corruption() -> None:
    logged = events(*COMPLETE_TURN)
    good = log_bytes("s", logged[:3]).splitlines(keepends=True)
    rest = "".join(f"{e.encode()}\n" for e in logged[4:]).encode()
    data = b"".join(good) + b"{not json\n" + rest
    with pytest.raises(CorruptLogError) as caught:
        scan_log(data, PATH)
    assert caught.value.line == 5
    assert caught.value.path == PATH
    assert str(caught.value).startswith(f"corrupt session log {PATH}, line 5: not valid JSON")


def test_a_seq_gap_before_a_turn_end_is_corruption() -> None:
    logged = events(*COMPLETE_TURN)
    del logged[2]
    data = (
        encode_header(SessionHeader("s", 0)) + "".join(f"{e.encode()}\n" for e in logged).encode()
    )
    with pytest.raises(CorruptLogError, match=r"line 4: seq 3 where 2 was expected"):
        scan_log(data, PATH)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b'{"type":"session","version":1,"id":"s","createdAt":0}\n', "newer than version 0"),
        (b'{"type":"session","version":-1,"id":"s","createdAt":0}\n', "older than version 0"),
        (b'{"format":"kai-session","version":2,"id":"s","createdAt":0}\n', "newer than version 1"),
        (b'{"format":"kai-session","version":0,"id":"s","createdAt":0}\n', "reads only version 1"),
        (b'{"format":"other"}\n', "is not a session log: its first line is not a session header"),
        (b"[1]\n", "is not a session log: its first line is not a session header"),
        (b"\x28\xb5\x2f\xfd\x04\x58", "it holds Zstandard data"),
        (
            b'{"type":"session","version":0,"id":"s","createdAt":0,"sandboxMode":"x"}\n',
            "retired fields sandboxMode",
        ),
    ],
)
def test_other_formats_are_unsupported_not_corrupt(header: bytes, message: str) -> None:
    with pytest.raises(UnsupportedFormatError, match=message) as caught:
        scan_log(header, PATH)
    assert str(PATH) in str(caught.value)
    assert not isinstance(caught.value, CorruptLogError)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "the header line is incomplete"),
        (b'{"format":"kai-session","vers', "the header line is incomplete"),
        (b'{"format":"kai-session","version":1,"createdAt":0}\n', "the header has no session id"),
        *(
            (
                b'{"format":"kai-session","version":1,"id":"s","createdAt":%s}\n' % created,
                "the header's createdAt is not an integer from 0 to 253402300799999 (epoch "
                "milliseconds up to the year 9999)",
            )
            for created in (b"-1", b"253402300800000", b"%d" % 10**30, b"1e999", b"1.5")
        ),
        (
            b'{"format":"kai-session","version":1,"id":"s","createdAt":0,"x":%s}\n'
            % (b"[" * 100_000 + b"]" * 100_000),
            "the header line is nested too deep",
        ),
    ],
)
def test_bad_headers_name_line_one(data: bytes, problem: str) -> None:
    with pytest.raises(CorruptLogError) as caught:
        scan_log(data, PATH)
    assert (caught.value.line, caught.value.problem) == (1, problem)


def test_nan_in_a_stored_line_is_corruption() -> None:
    data = log_bytes("s", events(*COMPLETE_TURN))
    bad = b'{"type":"x","seq":6,"time":1,"data":{"v":NaN}}\n'
    end = json.dumps({"type": "turn/end", "seq": 7, "time": 1, "data": {}}).encode() + b"\n"
    with pytest.raises(CorruptLogError, match=r"line 8: NaN is not a finite number$"):
        scan_log(data + bad + end, PATH)
