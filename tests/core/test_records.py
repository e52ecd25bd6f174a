"""The trace's records (proxy.core.records): one per observation, written as before, read back.

Every observation of the core has a record type or is declared untraced; each record is written
byte for byte as the trace has always had it (the lines below were written before the records
were typed), and what is written reads back into the same record.
"""

from __future__ import annotations

import json
import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import observations
from proxy.core.actions import ActionName
from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import InvalidReason, Kind
from proxy.core.observations import (
    CancelDropped,
    Check,
    Connected,
    Disconnected,
    DuplicateSwallowed,
    FaultInjected,
    FaultOverflowed,
    Finding,
    Handling,
    Held,
    HeldEnded,
    IdReused,
    InflightRefused,
    InitializeCached,
    InitializeTimedOut,
    InvalidSeen,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Orphaned,
    PeerGone,
    Relayed,
    RelayedRun,
    Restarted,
    RulesCounted,
    RulesReloaded,
    StallEnded,
    Stopped,
    TooManyPending,
    Undeliverable,
    Unroutable,
)
from proxy.core.records import (
    MESSAGE_FIELDS,
    TRACE_VERSION,
    UNTRACED,
    ConnectionRecord,
    Disposition,
    FaultRecord,
    FindingRecord,
    HeldEndedRecord,
    HeldRecord,
    KeyedMessageRecord,
    KeyedRecord,
    MessageRecord,
    ReloadRecord,
    RestartRecord,
    TraceHeader,
    UnknownRecord,
    as_json,
    decode,
    encode,
    record_of,
)

A, C = Direction.TO_AGENT, Direction.TO_CLIENT
PROMPT = Relayed(
    direction=A,
    kind=Kind.REQUEST,
    method="session/prompt",
    session="S",
    size=90,
    original_id=b'"p1"',
    forwarded_id=b"4",
)
COPY = Relayed(
    direction=A,
    kind=Kind.REQUEST,
    method="session/prompt",
    session="S",
    size=90,
    original_id=b'"p1"',
    forwarded_id=b"5",
    copy=True,
)

# Each observation, its record type, and its line as the trace wrote it before records were typed
# (time 5.0, link 3).
WRITTEN: list[tuple[Observation, type | None, str]] = [
    (
        PROMPT,
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"relayed","direction":"to_agent",'
        '"kind":"request","method":"session/prompt","session":"S","id":"p1","forwarded_id":4,'
        '"size":90}',
    ),
    (
        Relayed(
            direction=C,
            kind=Kind.RESPONSE,
            method="session/prompt",
            session="S",
            size=40,
            original_id=b'"p1"',
            forwarded_id=b"4",
            duration=0.0123456,
        ),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"relayed","direction":"to_client",'
        '"kind":"response","method":"session/prompt","session":"S","id":"p1","forwarded_id":4,'
        '"size":40,"duration_ms":12.346}',
    ),
    (
        Relayed(
            direction=A,
            kind=Kind.REQUEST,
            method="session/prompt",
            session="S",
            size=90,
            original_id=b'"p1"',
            forwarded_id=b"5",
            copy=True,
            hold=7,
        ),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"relayed","direction":"to_agent",'
        '"kind":"request","method":"session/prompt","session":"S","id":"p1","forwarded_id":5,'
        '"size":90,"copy":true,"hold":7}',
    ),
    (
        Relayed(
            direction=C, kind=Kind.NOTIFICATION, method="session/update", session=None, size=30
        ),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"relayed","direction":"to_client",'
        '"kind":"notification","method":"session/update","session":null,"id":null,'
        '"forwarded_id":null,"size":30}',
    ),
    (
        Held(hold=7, rules=("slow", "twice"), delay=0.25, relayed=COPY),
        HeldRecord,
        '{"time":5.0,"link":3,"event":"held","hold":7,"rules":["slow","twice"],"delay_ms":250.0,'
        '"direction":"to_agent","kind":"request","method":"session/prompt","session":"S",'
        '"id":"p1","forwarded_id":5,"size":90,"copy":true}',
    ),
    (
        Held(hold=8, rules=("slow",), delay=1.5, relayed=PROMPT),
        HeldRecord,
        '{"time":5.0,"link":3,"event":"held","hold":8,"rules":["slow"],"delay_ms":1500.0,'
        '"direction":"to_agent","kind":"request","method":"session/prompt","session":"S",'
        '"id":"p1","forwarded_id":4,"size":90}',
    ),
    (
        Held(hold=9, rules=("bp",), delay=60.0, relayed=PROMPT, held_id=12, then="drop"),
        HeldRecord,
        '{"time":5.0,"link":3,"event":"held","hold":9,"rules":["bp"],"delay_ms":60000.0,'
        '"direction":"to_agent","kind":"request","method":"session/prompt","session":"S",'
        '"id":"p1","forwarded_id":4,"size":90,"held_id":12,"then":"drop"}',
    ),
    (
        HeldEnded(
            held_id=12,
            hold=9,
            outcome="edit",
            rule="bp",
            relayed=PROMPT,
            digest="0123456789abcdef",
            edited_digest="fedcba9876543210",
        ),
        HeldEndedRecord,
        '{"time":5.0,"link":3,"event":"held_ended","held_id":12,"hold":9,"outcome":"edit",'
        '"rule":"bp","digest":"0123456789abcdef","edited_digest":"fedcba9876543210"}',
    ),
    (
        HeldEnded(
            held_id=13,
            hold=10,
            outcome="link_end",
            rule="bp",
            relayed=Relayed(
                direction=A, kind=Kind.NOTIFICATION, method="session/cancel", session="S", size=60
            ),
        ),
        HeldEndedRecord,
        '{"time":5.0,"link":3,"event":"held_ended","held_id":13,"hold":10,"outcome":"link_end",'
        '"rule":"bp"}',
    ),
    (
        Stopped(
            direction=C,
            kind=Kind.RESPONSE,
            method="session/prompt",
            session="S",
            size=40,
            original_id=b'"p1"',
            forwarded_id=b"4",
            rule="lose",
            disposition="dropped",
        ),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"dropped","direction":"to_client",'
        '"kind":"response","method":"session/prompt","session":"S","id":"p1","forwarded_id":4,'
        '"size":40,"rule":"lose"}',
    ),
    (
        InvalidSeen(
            direction=A,
            reason=InvalidReason.INVALID_JSON,
            size=8,
            detail="bad",
            handling=Handling.FORWARDED,
        ),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"invalid","direction":"to_agent",'
        '"kind":"invalid","reason":"invalid_json","handling":"forwarded","size":8}',
    ),
    (
        Orphaned(C, b"999", Kind.RESPONSE),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"orphaned","direction":"to_client",'
        '"kind":"response","forwarded_id":999}',
    ),
    (
        Undeliverable(direction=A, kind=Kind.NOTIFICATION, size=12),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"undeliverable",'
        '"direction":"to_agent","kind":"notification","size":12}',
    ),
    (
        Undeliverable(
            direction=A,
            kind=Kind.REQUEST,
            size=90,
            method="session/prompt",
            session=None,
            original_id=b'"p1"',
            forwarded_id=b"4",
            hold=7,
        ),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"undeliverable",'
        '"direction":"to_agent","kind":"request","size":90,"method":"session/prompt",'
        '"session":null,"id":"p1","forwarded_id":4,"hold":7}',
    ),
    (
        Unroutable(C, 50),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"unroutable",'
        '"direction":"to_client","kind":"error","size":50}',
    ),
    (
        CancelDropped(A, b"3"),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"cancel_dropped",'
        '"direction":"to_agent","kind":"notification","method":"$/cancel_request","id":3}',
    ),
    (
        CancelDropped(A, None),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"cancel_dropped",'
        '"direction":"to_agent","kind":"notification","method":"$/cancel_request","id":null}',
    ),
    (
        DuplicateSwallowed(
            direction=C,
            method="session/prompt",
            session="S",
            original_id=b'"p1"',
            forwarded_id=b"5",
            data=b'{"x":1}',
        ),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"swallowed","direction":"to_client",'
        '"kind":"response","method":"session/prompt","session":"S","id":"p1","forwarded_id":5,'
        '"size":7}',
    ),
    (
        InitializeCached(b"0"),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"answered_from_cache",'
        '"direction":"to_agent","kind":"request","method":"initialize","id":0}',
    ),
    (
        InitializeTimedOut(id=b'"i"', forwarded_id=b"0", timeout=30.0),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"timed_out","direction":"to_client",'
        '"kind":"error","method":"initialize","id":"i","forwarded_id":0,"timeout_ms":30000.0}',
    ),
    (
        FaultInjected(
            rule="lose",
            action="drop",
            direction=C,
            kind=Kind.RESPONSE,
            method="session/prompt",
            session="S",
            id=b"4",
        ),
        FaultRecord,
        '{"time":5.0,"link":3,"event":"fault","rule":"lose","action":"drop",'
        '"direction":"to_client","kind":"response","method":"session/prompt","session":"S",'
        '"id":4}',
    ),
    (
        Connected(Side.CLIENT, "stdio"),
        ConnectionRecord,
        '{"time":5.0,"link":3,"event":"connection","state":"open","side":"client",'
        '"transport":"stdio"}',
    ),
    (
        Disconnected(Side.AGENT, "ws"),
        ConnectionRecord,
        '{"time":5.0,"link":3,"event":"connection","state":"closed","side":"agent",'
        '"transport":"ws"}',
    ),
    (
        Restarted("agent", 2),
        RestartRecord,
        '{"time":5.0,"link":3,"event":"restart","what":"agent","abandoned":2}',
    ),
    (
        RulesReloaded("success", 3),
        ReloadRecord,
        '{"time":5.0,"link":3,"event":"reload","result":"success","rules":3}',
    ),
    (
        Finding(check=Check.DUPLICATE_INSERT, session="S", key="K", detail="two messages"),
        FindingRecord,
        '{"time":5.0,"link":3,"event":"finding","check":"duplicate_insert","session":"S",'
        '"key":"K","detail":"two messages"}',
    ),
    (
        Finding(check=Check.KEY_ECHOED, session=None, key=None, detail="d"),
        FindingRecord,
        '{"time":5.0,"link":3,"event":"finding","check":"key_echoed","session":null,"key":null,'
        '"detail":"d"}',
    ),
    (
        KeyedAttempt(session="S", retry=True, key="K1", prompt="0123abcd"),
        KeyedRecord,
        '{"time":5.0,"link":3,"event":"keyed","session":"S","key":"K1","prompt":"0123abcd",'
        '"retry":true}',
    ),
    (
        KeyedMessage(session="S", key="K1", message_id="M1", via="insert"),
        KeyedMessageRecord,
        '{"time":5.0,"link":3,"event":"keyed_message","session":"S","key":"K1",'
        '"message_id":"M1","via":"insert"}',
    ),
    (
        TooManyPending(
            direction=A,
            method="session/prompt",
            session="S",
            original_id=b'"p9"',
            limit=2,
            first=True,
        ),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"too_many_pending",'
        '"direction":"to_agent","kind":"request","method":"session/prompt","session":"S",'
        '"id":"p9","limit":2}',
    ),
    (
        InflightRefused(A, 4096, 1 << 20),
        MessageRecord,
        '{"time":5.0,"link":3,"event":"message","disposition":"too_much_in_flight",'
        '"direction":"to_agent","size":4096,"in_flight":1048576}',
    ),
    (IdReused(A, b"1", "m"), None, ""),
    (FaultOverflowed(rule="slow", action="delay", direction=A, method="m"), None, ""),
    (PeerGone(Side.AGENT, 2), None, ""),
    (RulesCounted(), None, ""),
    (StallEnded(rule="quiet", direction=A, held=2), None, ""),
]


def _core_observations() -> set[type[Observation]]:
    found: set[type[Observation]] = set()
    pending = [Observation]
    while pending:
        for kind in pending.pop().__subclasses__():
            # dataclass(slots=True) makes a new class: the one the module holds is the real one
            if getattr(observations, kind.__name__, None) is kind and kind is not RelayedRun:
                found.add(kind)  # a run is told as its Relayed each (records_of)
            pending.append(kind)
    return found


def test_every_observation_has_a_record_type_or_is_untraced() -> None:
    """Each observation the core declares is turned into its record, or is declared untraced:
    a new observation without either fails here."""
    covered = {type(observation) for observation, _, _ in WRITTEN}
    assert covered == _core_observations()
    for observation, kind, _ in WRITTEN:
        record = record_of(observation, 3, 5.0)
        if kind is None:
            assert record is None
            assert type(observation) in UNTRACED
        else:
            assert type(record) is kind


@pytest.mark.parametrize(("observation", "line"), [(o, line) for o, k, line in WRITTEN if k])
def test_each_record_is_written_as_the_trace_always_had_it(
    observation: Observation, line: str
) -> None:
    """Byte for byte: the same keys, in the same order, with the same values."""
    record = record_of(observation, 3, 5.0)
    assert record is not None
    assert encode(record) == line.encode()


@pytest.mark.parametrize("observation", [o for o, kind, _ in WRITTEN if kind])
def test_a_record_written_reads_back_the_same(observation: Observation) -> None:
    """What :func:`encode` writes, :func:`decode` reads into an equal record."""
    record = record_of(observation, 3, 5.0)
    assert record is not None
    assert decode(encode(record)) == record


def test_the_header_and_every_disposition_read_back() -> None:
    """The header carries the version; a message of each disposition keeps its fields."""
    header = TraceHeader(time=1.5, version=TRACE_VERSION)
    assert encode(header) == b'{"time":1.5,"event":"trace","version":1}'
    assert decode(encode(header)) == header
    for disposition in Disposition:
        record = MessageRecord(
            time=2.0, link=None, disposition=disposition, direction=A, kind=Kind.REQUEST
        )
        back = decode(encode(record))
        assert isinstance(back, MessageRecord)
        assert back.disposition is disposition
        written = MESSAGE_FIELDS[disposition]
        if disposition is Disposition.UNDELIVERABLE:
            written = written[:3]  # named only when it was held
        unset = ("duration_ms", "copy", "hold")
        assert list(as_json(record)) == [
            "time",
            "link",
            "event",
            "disposition",
            *(name for name in written if name not in unset),
        ]


def test_what_a_reader_tolerates_and_what_it_refuses() -> None:
    """An unknown event is read as such; an unknown field is ignored; a value a newer writer may
    add to a growing vocabulary is read as its text; a line whose known fields do not hold what
    they should, or that is no record, is none."""
    unknown = decode(b'{"time":1,"link":2,"event":"breakpoint","paused":true}')
    assert unknown == UnknownRecord(time=1.0, link=2, event="breakpoint")
    newer = decode(
        b'{"time":1,"link":null,"event":"restart","what":"agent","abandoned":0,"cause":"x"}'
    )
    assert newer == RestartRecord(time=1.0, link=None, what="agent", abandoned=0)
    grown = decode(
        b'{"time":1,"link":1,"event":"message","disposition":"teleported","direction":"to_agent",'
        b'"kind":"invalid","reason":"warped","size":3}'
    )
    assert isinstance(grown, MessageRecord)
    assert (grown.disposition, grown.reason, grown.size) == ("teleported", "warped", 3)
    known = decode(encode(grown))  # written back with every field it has
    assert known == grown
    check = decode(
        b'{"time":1,"link":1,"event":"finding","check":"new_check","session":null,"key":null,'
        b'"detail":"d"}'
    )
    assert isinstance(check, FindingRecord)
    assert check.check == "new_check"
    fault = b'{"time":1,"link":1,"event":"fault","rule":"r","action":"%s","direction":"to_agent",'
    fault += b'"kind":"request","method":null,"session":null,"id":1}'
    dropped, teleported = decode(fault % b"drop"), decode(fault % b"teleport")
    assert isinstance(dropped, FaultRecord)
    assert isinstance(teleported, FaultRecord)
    assert dropped.action is ActionName.DROP  # a built-in action's name is its member
    assert teleported.action == "teleport"  # another package's action is its name
    relayed = decode(
        b'{"time":1,"link":1,"event":"message","disposition":"relayed","direction":"to_agent",'
        b'"kind":"request","reason":"invalid_json"}'
    )
    assert isinstance(relayed, MessageRecord)
    assert relayed.disposition is Disposition.RELAYED  # a value it knows is its member
    assert relayed.reason is InvalidReason.INVALID_JSON
    for line in [
        b"",
        b"not json",
        b"[1]",
        b'{"event":"trace","version":1}',
        b'{"time":"1","event":"trace","version":1}',
        b'{"time":true,"event":"trace","version":1}',
        b'{"time":1e400,"event":"trace","version":1}',
        b'{"time":1,"event":5}',
        b'{"time":1,"event":"restart","what":"everything","abandoned":0}',
        b'{"time":1,"event":"message","direction":"sideways","kind":"request"}',
        b'{"time":1,"event":"fault","rule":"r"}',
        b'{"time":1,"event":"keyed","session":"S","key":"K","prompt":"p","retry":"yes"}',
        b'{"time":1,"event":"held","hold":1,"rules":"slow","delay_ms":1,"direction":"to_agent",'
        b'"kind":"request","method":null,"session":null,"id":null,"forwarded_id":null,"size":1}',
    ]:
        assert decode(line) is None, line


def test_a_lone_surrogate_is_written_as_text() -> None:
    """A method or session holding a lone surrogate (valid JSON, not UTF-8) is written as the
    text ``\\ud800``, a line every reader takes."""
    relayed = Relayed(
        direction=A,
        kind=Kind.REQUEST,
        method="x/\ud800",
        session="\udc00",
        size=9,
        original_id=b"1",
        forwarded_id=b"0",
    )
    record = record_of(relayed, 3, 5.0)
    assert record is not None
    line = encode(record)
    assert json.loads(line)["method"] == "x/\\ud800"
    back = decode(line)
    assert isinstance(back, MessageRecord)
    assert (back.method, back.session) == ("x/\\ud800", "\\udc00")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
ids = json_values.map(orjson.dumps) | st.binary(max_size=6)
seconds = st.floats(0, 1e6, allow_nan=False).filter(math.isfinite)


@st.composite
def relayed(draw: st.DrawFn) -> Relayed:
    return Relayed(
        direction=draw(st.sampled_from(Direction)),
        kind=draw(st.sampled_from(Kind)),
        method=draw(st.none() | texts),
        session=draw(st.none() | texts),
        size=draw(st.integers(0, 2**40)),
        original_id=draw(st.none() | ids),
        forwarded_id=draw(st.none() | ids),
        duration=draw(st.none() | seconds),
        copy=draw(st.booleans()),
        hold=draw(st.none() | st.integers(0, 2**31)),
    )


observations_st = st.one_of(
    relayed(),
    st.builds(
        Held,
        hold=st.integers(0, 2**31),
        rules=st.lists(texts, max_size=3).map(tuple),
        delay=seconds,
        relayed=relayed(),
    ),
    st.builds(
        Stopped,
        direction=st.sampled_from(Direction),
        kind=st.sampled_from(Kind),
        method=st.none() | texts,
        session=st.none() | texts,
        size=st.integers(0, 2**40),
        original_id=st.none() | ids,
        forwarded_id=st.none() | ids,
        rule=texts,
        disposition=st.sampled_from(["dropped", "answered_by_proxy", "severed", "refused"]),
    ),
    st.builds(
        Undeliverable,
        direction=st.sampled_from(Direction),
        kind=st.sampled_from(Kind),
        size=st.integers(0, 2**40),
        method=st.none() | texts,
        session=st.none() | texts,
        original_id=st.none() | ids,
        forwarded_id=st.none() | ids,
        hold=st.integers(0, 9),
    ),
    st.builds(
        FaultInjected,
        rule=texts,
        action=texts,
        direction=st.sampled_from(Direction),
        kind=st.sampled_from(Kind),
        method=st.none() | texts,
        session=st.none() | texts,
        id=st.none() | ids,
    ),
    st.builds(
        Finding,
        check=st.sampled_from(Check),
        session=st.none() | texts,
        key=st.none() | texts,
        detail=texts,
    ),
)


@given(observations_st, st.none() | st.integers(0, 2**31), seconds)
def test_any_record_round_trips(observation: Observation, link: int | None, at: float) -> None:
    """Whatever the peers sent (ids of any JSON or none, names of any text), the record of an
    observation reads back equal to itself."""
    record = record_of(observation, link, at)
    assert record is not None
    assert decode(encode(record)) == record
