"""The relay rules of DESIGN 5, table by table, on the sans-I/O core (no sockets, no clock)."""

from __future__ import annotations

import json
from typing import TypeVar

import pytest

from proxy.core.commands import Close, Command, Send, StartTimer
from proxy.core.events import (
    Direction,
    MessageReceived,
    OversizedReceived,
    PeerClosed,
    Side,
    TimerFired,
)
from proxy.core.invalid import MAX_INVALID_PENDING
from proxy.core.jsonrpc import InvalidReason, Kind
from proxy.core.observations import (
    CancelDropped,
    Handling,
    IdReused,
    InitializeTimedOut,
    InvalidSeen,
    Observation,
    Orphaned,
    PeerGone,
    Relayed,
    TooManyPending,
    Undeliverable,
    Unroutable,
)
from proxy.core.relay import Relay
from proxy.core.splice import MAX_STEPS

CLIENT, AGENT = Side.CLIENT, Side.AGENT
T = TypeVar("T", bound=Observation)


def feed(relay: Relay, side: Side, raw: bytes, at: float = 0.0) -> list[Command]:
    return relay.handle(MessageReceived(side, raw, at))


def sends(commands: list[Command]) -> list[tuple[Side, bytes]]:
    return [(c.to, c.data) for c in commands if isinstance(c, Send)]


def only_send(commands: list[Command], to: Side) -> bytes:
    sent = sends(commands)
    assert len(sent) == 1, sent
    assert sent[0][0] is to
    return sent[0][1]


def observed(commands: list[Command], kind: type[T]) -> list[T]:
    return [c for c in commands if isinstance(c, kind)]


def request(id_token: bytes, method: str = "session/prompt", params: bytes = b"{}") -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":'
        + id_token
        + b',"method":"'
        + method.encode()
        + b'","params":'
        + params
        + b"}"
    )


def result(id_token: bytes, body: bytes = b"{}") -> bytes:
    return b'{"jsonrpc":"2.0","id":' + id_token + b',"result":' + body + b"}"


class TestIdRewriting:
    @pytest.mark.parametrize(
        "client_id",
        [
            b"0",
            b"1",
            b'"0"',
            b'"1"',
            b"-3",
            b"9007199254740993",
            b"123456789012345678901234567890",
            b'"uuid-\\u00e9"',
            b"null",
        ],
    )
    def test_original_id_returns_with_its_exact_bytes(self, client_id: bytes) -> None:
        """The agent sees the proxy's id; the client gets its own id back, type and spelling kept."""
        relay = Relay()
        forwarded = only_send(feed(relay, CLIENT, request(client_id)), AGENT)
        assert forwarded == request(b"0")
        answer = only_send(feed(relay, AGENT, result(b"0", b'{"messageId":"m"}')), CLIENT)
        assert answer == result(client_id, b'{"messageId":"m"}')

    def test_proxy_mints_a_new_id_per_request(self) -> None:
        """Each forwarded request gets the next id of its direction."""
        relay = Relay()
        assert only_send(feed(relay, CLIENT, request(b'"a"')), AGENT) == request(b"0")
        assert only_send(feed(relay, CLIENT, request(b'"b"')), AGENT) == request(b"1")
        assert only_send(
            feed(relay, AGENT, request(b"77", "session/request_permission")), CLIENT
        ) == request(b"0", "session/request_permission")

    def test_same_id_pending_both_ways(self) -> None:
        """Client and Agent may both have id 0 outstanding; each answer goes to its own asker."""
        relay = Relay()
        feed(relay, CLIENT, request(b"0"))  # client's 0 -> agent's 0
        to_client = only_send(
            feed(relay, AGENT, request(b"0", "session/request_permission")), CLIENT
        )
        assert json.loads(to_client)["id"] == 0  # proxy's own id toward the client
        # The client answers the agent's request (under the proxy's id 0) ...
        assert only_send(feed(relay, CLIENT, result(b"0", b'{"outcome":1}')), AGENT) == result(
            b"0", b'{"outcome":1}'
        )
        # ... and the agent answers the client's prompt.
        assert only_send(feed(relay, AGENT, result(b"0", b'{"m":2}')), CLIENT) == result(
            b"0", b'{"m":2}'
        )
        assert relay.pending(Direction.TO_AGENT) == relay.pending(Direction.TO_CLIENT) == 0

    def test_int_and_string_ids_are_different_requests(self) -> None:
        """1 and "1" pending at once are two requests, each answered under its own id."""
        relay = Relay()
        feed(relay, CLIENT, request(b"1"))
        commands = feed(relay, CLIENT, request(b'"1"'))
        assert not observed(commands, IdReused)
        assert only_send(feed(relay, AGENT, result(b"1")), CLIENT) == result(b'"1"')
        assert only_send(feed(relay, AGENT, result(b"0")), CLIENT) == result(b"1")

    def test_error_responses_are_routed_like_results(self) -> None:
        """An error answer gets the original id back."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"x"'))
        error = b'{"jsonrpc":"2.0","id":0,"error":{"code":-32602,"message":"bad key"}}'
        assert only_send(feed(relay, AGENT, error), CLIENT) == error.replace(b'"id":0', b'"id":"x"')

    def test_duplicate_id_members_are_all_rewritten(self) -> None:
        """Whichever duplicate a peer's parser keeps, it sees the proxy's id."""
        relay = Relay()
        forwarded = only_send(feed(relay, CLIENT, b'{"id":5,"method":"m","id":5}'), AGENT)
        assert forwarded == b'{"id":0,"method":"m","id":0}'

    def test_response_records_method_session_and_duration(self) -> None:
        """A response is observed with its request's method and session and the time it took."""
        relay = Relay()
        feed(relay, CLIENT, request(b"3", "session/prompt", b'{"sessionId":"S"}'), at=10.0)
        commands = feed(relay, AGENT, result(b"0"), at=12.5)
        [seen] = observed(commands, Relayed)
        assert (seen.kind, seen.method, seen.session, seen.duration) == (
            Kind.RESPONSE,
            "session/prompt",
            "S",
            2.5,
        )
        assert (seen.original_id, seen.forwarded_id) == (b"3", b"0")


class TestByteIdentity:
    @pytest.mark.parametrize(
        "params",
        [
            b'{"sessionId":"S","idempotencyKey":"0b6f3c1e-8d2a","prompt":[{"type":"text","text":"hi"}],"_meta":{"x":[1,{"y":null}]}}',
            b'{"text":"esc \\" \\\\ \\/ \\b\\f\\n\\r\\t \\u00e9 \\ud83d\\ude00 \xc3\xa9 \xf0\x9f\x98\x80"}',
            b'{"big":123456789012345678901234567890,"float":1e400,"neg":-0.0e-10}',
            b'{"dup":1,"dup":2,"unknown":{"sessionUpdate":"_custom"}}',
            b'{ "spaced" :\t[ 1 ,\r 2 ] }',
            b'{"lone":"\\ud800"}',
        ],
    )
    def test_everything_but_the_id_passes_byte_for_byte(self, params: bytes) -> None:
        """Escapes, unicode, big numbers, duplicate keys and whitespace survive unchanged."""
        relay = Relay()
        forwarded = only_send(
            feed(relay, CLIENT, request(b'"c-1"', "session/prompt", params)), AGENT
        )
        assert forwarded == request(b"0", "session/prompt", params)
        back = only_send(feed(relay, AGENT, result(b"0", params)), CLIENT)
        assert back == result(b'"c-1"', params)

    def test_id_position_and_spacing_do_not_matter(self) -> None:
        """Only the id value's bytes change, wherever the member stands."""
        relay = Relay()
        raw = b'{ "method" : "m" , "params" : {"id": "inner"} , "id" :  "outer" , "jsonrpc":"2.0"}'
        forwarded = only_send(feed(relay, CLIENT, raw), AGENT)
        assert forwarded == raw.replace(b'"outer"', b"0")

    def test_notifications_pass_unchanged_and_are_never_answered(self) -> None:
        """A notification is forwarded as it is, and nothing goes back to its sender."""
        relay = Relay()
        update = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S","update":{"sessionUpdate":"user_message","messageId":"M"}}}'
        commands = feed(relay, AGENT, update)
        assert sends(commands) == [(CLIENT, update)]
        unknown = b'{"jsonrpc":"2.0","method":"_x/whatever","params":[1,2]}'
        assert sends(feed(relay, CLIENT, unknown)) == [(AGENT, unknown)]

    def test_entity_ids_and_mcp_inner_ids_are_untouched(self) -> None:
        """mcp/message requestId and other protocol ids inside params are not rewritten."""
        relay = Relay()
        params = b'{"sessionId":"S","requestId":0,"messageId":"m","toolCallId":"t"}'
        forwarded = only_send(feed(relay, CLIENT, request(b"5", "mcp/message", params)), AGENT)
        assert forwarded == request(b"0", "mcp/message", params)


class TestFifo:
    def test_order_is_kept_per_direction(self) -> None:
        """Messages leave in the order they arrived, notifications and responses interleaved."""
        relay = Relay()
        feed(relay, CLIENT, request(b"1"))
        out: list[bytes] = []
        for raw in [
            b'{"method":"session/update","params":{"n":1}}',
            result(b"0"),
            b'{"method":"session/update","params":{"n":2}}',
        ]:
            out += [data for _, data in sends(feed(relay, AGENT, raw))]
        assert [json.loads(data).get("params", {}).get("n", "r") for data in out] == [1, "r", 2]


class TestCancellation:
    def test_cancel_is_translated_to_the_next_hop_id(self) -> None:
        """$/cancel_request names the agent's id for the request, every other byte kept."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"p1"'))
        feed(relay, CLIENT, request(b'"p2"'))
        cancel = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"p2","_meta":{"k":1}}}'
        assert only_send(feed(relay, CLIENT, cancel), AGENT) == cancel.replace(b'"p2"', b"1")

    def test_agent_cancel_of_its_own_request_is_translated(self) -> None:
        """The agent cancelling its permission request reaches the client under the proxy's id."""
        relay = Relay()
        feed(relay, CLIENT, request(b"0"))
        feed(relay, CLIENT, request(b"1"))
        feed(relay, AGENT, request(b"0", "session/request_permission"))
        feed(relay, AGENT, request(b"1", "session/request_permission"))
        cancel = b'{"method":"$/cancel_request","params":{"requestId":0}}'
        assert only_send(feed(relay, AGENT, cancel), CLIENT) == cancel

        cancel = b'{"method":"$/cancel_request","params":{"requestId":1}}'
        assert only_send(feed(relay, AGENT, cancel), CLIENT) == cancel

    @pytest.mark.parametrize(
        "cancel",
        [
            b'{"method":"$/cancel_request","params":{"requestId":99}}',
            b'{"method":"$/cancel_request","params":{"requestId":"0"}}',
            b'{"method":"$/cancel_request","params":{}}',
            b'{"method":"$/cancel_request"}',
            b'{"method":"$/cancel_request","params":{"requestId":true}}',
        ],
    )
    def test_cancel_of_an_unknown_request_is_dropped(self, cancel: bytes) -> None:
        """A cancel naming no pending request of its sender is dropped and recorded."""
        relay = Relay()
        feed(relay, CLIENT, request(b"0"))
        commands = feed(relay, CLIENT, cancel)
        assert sends(commands) == []
        assert len(observed(commands, CancelDropped)) == 1

    def test_cancel_of_an_answered_request_is_dropped(self) -> None:
        """Once answered, a request can no longer be cancelled across the proxy."""
        relay = Relay()
        feed(relay, CLIENT, request(b"7"))
        feed(relay, AGENT, result(b"0"))
        assert (
            sends(feed(relay, CLIENT, b'{"method":"$/cancel_request","params":{"requestId":7}}'))
            == []
        )

    def test_cancel_only_names_the_senders_own_requests(self) -> None:
        """The client cannot cancel, by its id, a request that the agent sent."""
        relay = Relay()
        feed(relay, AGENT, request(b"4", "session/request_permission"))
        assert (
            sends(feed(relay, CLIENT, b'{"method":"$/cancel_request","params":{"requestId":4}}'))
            == []
        )

    def test_cancel_inside_a_successor_envelope(self) -> None:
        """A cancel carried in proxy/successor names the envelope's next-hop id."""
        relay = Relay()
        envelope = b'{"id":"c-41","method":"proxy/successor","params":{"method":"session/prompt","params":{"idempotencyKey":"K"}}}'
        assert only_send(feed(relay, CLIENT, envelope), AGENT) == envelope.replace(b'"c-41"', b"0")
        cancel = b'{"method":"_proxy/successor","params":{"method":"$/cancel_request","requestId":"c-41"}}'
        assert only_send(feed(relay, CLIENT, cancel), AGENT) == cancel.replace(b'"c-41"', b"0")


class TestElicitation:
    def test_request_id_is_mapped_back_to_the_clients_id(self) -> None:
        """elicitation/create.params.requestId names the client's request by the client's id."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"prompt-9"'))
        elicit = request(
            b"50", "elicitation/create", b'{"mode":"form","requestId":0,"sessionId":"S"}'
        )
        to_client = only_send(feed(relay, AGENT, elicit), CLIENT)
        assert to_client == request(
            b"0", "elicitation/create", b'{"mode":"form","requestId":"prompt-9","sessionId":"S"}'
        )

    def test_unknown_request_id_is_left_as_is(self) -> None:
        """A requestId naming nothing pending is forwarded unchanged."""
        relay = Relay()
        elicit = request(b"50", "elicitation/create", b'{"requestId":8}')
        assert only_send(feed(relay, AGENT, elicit), CLIENT) == request(
            b"0", "elicitation/create", b'{"requestId":8}'
        )


class TestUnknownResponses:
    @pytest.mark.parametrize("token", [b"5", b'"0"'])
    def test_response_with_unknown_id_is_dropped(self, token: bytes) -> None:
        """Nothing pending under that id (or not that type): dropped and recorded."""
        relay = Relay()
        feed(relay, CLIENT, request(b"1"))
        commands = feed(relay, AGENT, result(token))
        assert sends(commands) == []
        assert [o.id for o in observed(commands, Orphaned)] == [token]

    @pytest.mark.parametrize("token", [b"0.0", b"true", b"[0]"])
    def test_response_with_an_invalid_id_is_dropped_not_forwarded(self, token: bytes) -> None:
        """0.0 could alias the client's 0: a response that is not routable is never forwarded."""
        relay = Relay()
        feed(relay, CLIENT, request(b"0"))
        commands = feed(relay, AGENT, result(token))
        assert sends(commands) == []
        [seen] = observed(commands, InvalidSeen)
        assert (seen.reason, seen.handling) == (InvalidReason.INVALID_ID, Handling.DROPPED)
        assert sends(feed(relay, AGENT, b"[" + result(token) + b"]")) == []

    def test_a_second_answer_is_dropped(self) -> None:
        """A duplicated response reaches the client once."""
        relay = Relay()
        feed(relay, CLIENT, request(b"1"))
        assert len(sends(feed(relay, AGENT, result(b"0")))) == 1
        commands = feed(relay, AGENT, result(b"0"))
        assert sends(commands) == []
        assert len(observed(commands, Orphaned)) == 1

    def test_error_with_null_id_is_forwarded(self) -> None:
        """A parse-error answer (id null) cannot be routed and goes through as it is."""
        relay = Relay()
        error = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}'
        commands = feed(relay, AGENT, error)
        assert sends(commands) == [(CLIENT, error)]
        assert len(observed(commands, Unroutable)) == 1

    def test_result_with_null_id_is_an_orphan(self) -> None:
        """A success with id null answers nothing the proxy sent."""
        relay = Relay()
        assert sends(feed(relay, AGENT, result(b"null"))) == []


class TestIdReuse:
    def test_reused_pending_id_is_relayed_and_recorded(self) -> None:
        """Both requests reach the agent under distinct ids; both answers carry the reused id."""
        relay = Relay()
        feed(relay, CLIENT, request(b"3"))
        commands = feed(relay, CLIENT, request(b"3"))
        assert only_send(commands, AGENT) == request(b"1")
        assert [o.id for o in observed(commands, IdReused)] == [b"3"]
        assert only_send(feed(relay, AGENT, result(b"1")), CLIENT) == result(b"3")
        assert only_send(feed(relay, AGENT, result(b"0")), CLIENT) == result(b"3")


class TestBatches:
    def test_each_element_is_rewritten_and_bad_elements_kept(self) -> None:
        """Requests get new ids, notifications pass, invalid entries stay for the peer to answer."""
        relay = Relay()
        batch = b'[{"id":"a","method":"x"}, {"method":"n"}, 5, {"id":"b","method":"y"}]'
        forwarded = only_send(feed(relay, CLIENT, batch), AGENT)
        assert forwarded == b'[{"id":0,"method":"x"},{"method":"n"},5,{"id":1,"method":"y"}]'

    def test_batch_of_answers_is_mapped_back_and_unknown_ones_removed(self) -> None:
        """Responses in a batch return to their ids; an unknown one is dropped from the batch."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"a"'))
        feed(relay, CLIENT, request(b'"b"'))
        commands = feed(
            relay, AGENT, b'[{"id":1,"result":2},{"id":9,"result":0},{"id":0,"result":1}]'
        )
        assert only_send(commands, CLIENT) == b'[{"id":"b","result":2},{"id":"a","result":1}]'
        assert len(observed(commands, Orphaned)) == 1

    def test_nothing_is_sent_when_every_element_is_dropped(self) -> None:
        """The proxy never creates a batch, not even an empty one."""
        relay = Relay()
        commands = feed(relay, AGENT, b'[{"id":1,"result":2}]')
        assert sends(commands) == []

    def test_empty_batch_is_invalid_input(self) -> None:
        """[] is forwarded for the peer to reject, as without a proxy."""
        relay = Relay()
        commands = feed(relay, CLIENT, b"[]")
        assert sends(commands) == [(AGENT, b"[]")]
        assert observed(commands, InvalidSeen)[0].reason is InvalidReason.EMPTY_BATCH


class TestInvalidInput:
    @pytest.mark.parametrize(
        ("raw", "reason"),
        [
            (b"{oops", InvalidReason.INVALID_JSON),
            (b'{"id":1,"method":"m","params":{"a":', InvalidReason.INVALID_JSON),  # truncated
            (b'{"method":"\xff"}', InvalidReason.NOT_UTF8),
            (b'{"jsonrpc":"2.0"}', InvalidReason.INVALID_SHAPE),
            (b'{"id":[1],"method":"m"}', InvalidReason.INVALID_ID),
        ],
    )
    def test_forwarded_untouched_by_default(self, raw: bytes, reason: InvalidReason) -> None:
        """The peer answers bad input as it would without a proxy (no id a peer could read)."""
        relay = Relay()
        commands = feed(relay, CLIENT, raw)
        assert sends(commands) == [(AGENT, raw)]
        [seen] = observed(commands, InvalidSeen)
        assert (seen.reason, seen.handling, seen.direction) == (
            reason,
            Handling.FORWARDED,
            Direction.TO_AGENT,
        )

    @pytest.mark.parametrize(
        ("raw", "reason"),
        [
            (request(b"0", "deep/one", b"[" * 1100 + b"]" * 1100), InvalidReason.INVALID_JSON),
            (request(b"0", "latin1/one", b'{"text":"caf\xe9"}'), InvalidReason.NOT_UTF8),
            (b'{"jsonrpc":"2.0","id":0,"method":5}', InvalidReason.INVALID_SHAPE),
            (b'{"jsonrpc":"2.0","id":0}', InvalidReason.INVALID_SHAPE),
        ],
    )
    def test_an_id_a_peer_could_read_is_rewritten_so_its_answer_cannot_collide(
        self, raw: bytes, reason: InvalidReason
    ) -> None:
        """A lenient Agent reads some invalid requests all the same and answers under their id:
        that id is rewritten like any request's, so the answer goes back to the Client under its
        own id and a valid request is answered with its own answer, never the other's."""
        relay = Relay()
        commands = feed(relay, CLIENT, raw)
        assert observed(commands, InvalidSeen)[0].reason is reason
        forwarded = only_send(commands, AGENT)
        assert forwarded == raw  # the proxy's first id is 0 too: now the proxy's own
        assert only_send(feed(relay, CLIENT, request(b'"a"', "session/new")), AGENT) == request(
            b"1", "session/new"
        )
        back = only_send(feed(relay, AGENT, result(b"0", b'{"answering":"invalid"}')), CLIENT)
        assert back == result(b"0", b'{"answering":"invalid"}')
        mine = only_send(feed(relay, AGENT, result(b"1", b'{"answering":"new"}')), CLIENT)
        assert mine == result(b'"a"', b'{"answering":"new"}')

    def test_a_readable_id_is_rewritten_under_the_proxys_numbering(self) -> None:
        """The invalid request's id is the proxy's next id, whatever the Client wrote."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"first"', "session/new"))
        raw = request(b'"x\\u0041"', "m", b'{"t":"\xff"}')
        forwarded = only_send(feed(relay, CLIENT, raw), AGENT)
        assert forwarded == request(b"1", "m", b'{"t":"\xff"}')
        assert only_send(feed(relay, AGENT, result(b"1")), CLIENT) == result(b'"x\\u0041"')

    @pytest.mark.parametrize(
        "raw",
        [
            b'\xef\xbb\xbf{"jsonrpc":"2.0","id":7,"method":"m"}',  # a BOM, which readers skip
            b'{"jsonrpc":"2.0","id":7.0,"method":"m"}',  # no valid id, but read as 7 by some
            b'[{"jsonrpc":"2.0","id":7.0,"method":"m"}]',  # the same in a batch
        ],
    )
    def test_ids_lenient_readers_take_are_rewritten_too(self, raw: bytes) -> None:
        """A BOM, or an id that a reader turns into an integer, gets the proxy's id too."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"first"', "session/new"))
        forwarded = only_send(feed(relay, CLIENT, raw), AGENT)
        assert forwarded == raw.replace(b'"id":7.0,', b'"id":1,').replace(b'"id":7,', b'"id":1,')
        answer = only_send(feed(relay, AGENT, result(b"1")), CLIENT)
        assert answer == result(b"7.0" if b"7.0" in raw else b"7")

    def test_an_invalid_request_is_pending_nowhere_else(self) -> None:
        """It counts as pending nowhere, a valid request reusing its id is no reuse, and a
        cancel of that id reaches only the valid one."""
        relay = Relay()
        feed(relay, CLIENT, request(b"1", "m", b'"\xff"'))
        assert relay.pending(Direction.TO_AGENT) == 0
        commands = feed(relay, CLIENT, request(b"1"))
        assert observed(commands, IdReused) == []
        cancel = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":1}}'
        sent = only_send(feed(relay, CLIENT, cancel), AGENT)
        assert json.loads(sent)["params"]["requestId"] == 1  # the valid request's id, once
        assert only_send(feed(relay, AGENT, result(b"0")), CLIENT) == result(b"1")
        assert relay.handle(PeerClosed(AGENT, 1.0))[0] == PeerGone(AGENT, 1)

    def test_strict_mode_never_forwards_an_invalid_answer(self) -> None:
        """--strict answers bad input itself and forwards none of it, answers included."""
        relay = Relay(strict=True)
        feed(relay, CLIENT, request(b"1"))
        feed(relay, CLIENT, request(b"2"))
        commands = feed(relay, AGENT, b'{"jsonrpc":"2.0","id":0,"result":"\xff"}')
        assert sends(commands) == []
        assert observed(commands, InvalidSeen)[0].handling is Handling.DROPPED
        batch = b'[{"jsonrpc":"2.0","id":1,"result":1.5,"error":{}},' + result(b"1") + b"]"
        commands = feed(relay, AGENT, batch)
        assert sends(commands) == [(CLIENT, b"[" + result(b"2") + b"]")]
        assert observed(commands, InvalidSeen)[0].handling is Handling.DROPPED

    def test_invalid_requests_awaiting_an_answer_are_bounded(self) -> None:
        """A peer that cannot read them answers under null: only the latest MAX_INVALID_PENDING
        are remembered; a late answer to an older one is an orphan, never another's answer."""
        relay = Relay()
        for n in range(MAX_INVALID_PENDING + 1):
            feed(relay, CLIENT, request(str(n).encode(), "m", b'"\xff"'))
        assert relay.pending(Direction.TO_AGENT) == 0  # most likely never answered: not pending
        late = feed(relay, AGENT, result(b"0"))
        assert sends(late) == []
        assert len(observed(late, Orphaned)) == 1
        assert only_send(feed(relay, AGENT, result(b"1")), CLIENT) == result(b"1")

    @pytest.mark.parametrize(
        "body",
        [
            b'"result":{"text":"caf\xe9"}',  # a Latin-1 byte: not UTF-8
            b'"result":{},"error":{"code":1}',  # both: neither a response nor an error
            b'"error":{"code":-32603,"data":' + b"[" * 1100 + b"]" * 1100 + b"}",  # too deep
        ],
    )
    def test_an_invalid_answer_reaches_the_request_it_names_and_only_that(
        self, body: bytes
    ) -> None:
        """An answer a lenient Client could read goes back under the Client's id, as without a
        proxy; the same answer again, or naming no pending request, is dropped (it could answer
        the wrong request)."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"keep"'))
        answer = b'{"jsonrpc":"2.0","id":0,' + body + b"}"
        commands = feed(relay, AGENT, answer)
        assert only_send(commands, CLIENT) == answer.replace(b'"id":0', b'"id":"keep"', 1)
        assert observed(commands, InvalidSeen)[0].handling is Handling.FORWARDED
        assert relay.pending(Direction.TO_AGENT) == 0
        for again in (answer, answer.replace(b'"id":0', b'"id":7', 1)):
            commands = feed(relay, AGENT, again)
            assert sends(commands) == []
            assert observed(commands, InvalidSeen)[0].handling is Handling.DROPPED

    @pytest.mark.parametrize(
        ("raw", "code"),
        [(b"{oops", -32700), (b'{"id":1,"method":"\xff"}', -32700), (b"17", -32600)],
    )
    def test_strict_mode_answers_them(self, raw: bytes, code: int) -> None:
        """With strict, the sender gets -32700 or -32600 with id null and nothing is forwarded."""
        relay = Relay(strict=True)
        answer = json.loads(only_send(feed(relay, AGENT, raw), AGENT))
        assert answer["id"] is None
        assert answer["error"]["code"] == code

    def test_oversized_messages_are_answered_never_forwarded(self) -> None:
        """A message over the limit gets an error naming sizes, back to its sender only."""
        relay = Relay()
        commands = relay.handle(OversizedReceived(CLIENT, 70_000_000, 67_108_864, 0.0))
        answer = json.loads(only_send(commands, CLIENT))
        assert answer["error"]["code"] == -32600
        assert "70000000" in answer["error"]["message"]
        assert observed(commands, InvalidSeen)[0].reason is InvalidReason.TOO_LARGE

    @pytest.mark.parametrize("strict", [False, True])
    def test_messages_too_complex_to_scan_are_answered_never_forwarded(self, strict: bool) -> None:
        """A valid request whose id the scanner cannot locate within its bounds (more members
        than its budget, "id" spelled twice) cannot have its id rewritten: its sender gets
        -32600 under id null and nothing is forwarded; an answer of that shape is dropped."""
        relay = Relay(strict=strict)
        members = b'"a":1,' * MAX_STEPS
        raw = b'{"jsonrpc":"2.0",' + members + b'"method":"m","id":1,"p":"id"}'
        commands = feed(relay, CLIENT, raw)
        answer = json.loads(only_send(commands, CLIENT))
        assert answer["id"] is None
        assert answer["error"]["code"] == -32600
        assert "too complex to relay" in answer["error"]["message"]
        seen = observed(commands, InvalidSeen)[0]
        assert (seen.reason, seen.handling) == (InvalidReason.TOO_COMPLEX, Handling.ANSWERED)
        answer_shaped = b'{"jsonrpc":"2.0",' + members + b'"result":{},"id":1,"p":"id"}'
        commands = feed(relay, AGENT, answer_shaped)
        assert sends(commands) == []
        seen = observed(commands, InvalidSeen)[0]
        assert (seen.reason, seen.handling) == (InvalidReason.TOO_COMPLEX, Handling.DROPPED)

    def test_a_batch_element_too_complex_is_answered_apart(self) -> None:
        """In a batch, an element too complex to relay is answered by the proxy; the rest of the
        batch goes on."""
        relay = Relay()
        members = b'"a":1,' * MAX_STEPS
        bad = b'{"jsonrpc":"2.0",' + members + b'"method":"m","id":1,"p":"id"}'
        commands = feed(relay, CLIENT, b"[" + bad + b"," + request(b"2") + b"]")
        (to_client, answer), (to_agent, forwarded) = sends(commands)
        assert (to_client, to_agent) == (CLIENT, AGENT)
        assert json.loads(answer)["error"]["code"] == -32600
        assert forwarded == b"[" + request(b"0") + b"]"

    def test_bad_input_does_not_disturb_pending_requests(self) -> None:
        """After garbage, a pending request is still answered correctly."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"keep"'))
        feed(relay, AGENT, b"\x00\x01garbage")
        assert only_send(feed(relay, AGENT, result(b"0")), CLIENT) == result(b'"keep"')


class TestPeerClosed:
    def test_agent_gone_closes_the_client_and_abandons_its_requests(self) -> None:
        """Pending requests to a dead agent are counted, never answered falsely."""
        relay = Relay()
        feed(relay, CLIENT, request(b"1"))
        feed(relay, CLIENT, request(b"2"))
        commands = relay.handle(PeerClosed(AGENT, 1.0))
        assert commands == [PeerGone(AGENT, 2), Close(CLIENT)]
        assert relay.has_ended(AGENT)
        assert relay.pending(Direction.TO_AGENT) == 0

    def test_client_gone_is_a_half_close(self) -> None:
        """The agent's stdin is closed, but its answers to earlier requests still reach the client."""
        relay = Relay()
        feed(relay, CLIENT, request(b'"q"'))
        feed(relay, AGENT, request(b"0", "session/request_permission"))
        commands = relay.handle(PeerClosed(CLIENT, 1.0))
        assert commands == [PeerGone(CLIENT, 1), Close(AGENT)]
        assert only_send(feed(relay, AGENT, result(b"0")), CLIENT) == result(b'"q"')

    def test_messages_for_a_closed_peer_are_dropped(self) -> None:
        """Once the proxy closed a peer, what arrives for it is recorded and dropped."""
        relay = Relay()
        relay.handle(PeerClosed(AGENT, 1.0))
        commands = feed(relay, AGENT, b'{"method":"late"}')
        assert sends(commands) == []
        assert observed(commands, Undeliverable)[0].kind is Kind.NOTIFICATION

    def test_closing_twice_does_nothing(self) -> None:
        """A second end-of-stream from the same peer changes nothing."""
        relay = Relay()
        relay.handle(PeerClosed(CLIENT, 1.0))
        assert relay.handle(PeerClosed(CLIENT, 2.0)) == []
        assert relay.handle(PeerClosed(AGENT, 2.0)) == [PeerGone(AGENT, 0), Close(CLIENT)]


class TestInitializeTimeout:
    def test_an_unanswered_initialize_is_answered_an_error_when_its_timer_fires(self) -> None:
        """The relay starts a timer with the initialize; when it fires the Client gets -32603
        under its own id, the request is forgotten and the Agent's late answer is an orphan."""
        relay = Relay(initialize_timeout=30.0)
        commands = feed(relay, CLIENT, request(b'"init"', "initialize"))
        [timer] = observed_timers(commands)
        assert timer.delay == 30.0
        fired = relay.handle(TimerFired(timer.token, 30.0))
        [timed_out] = observed(fired, InitializeTimedOut)
        assert (timed_out.id, timed_out.forwarded_id, timed_out.timeout) == (b'"init"', b"0", 30.0)
        error = json.loads(only_send(fired, CLIENT))
        assert error["id"] == "init"
        assert error["error"]["code"] == -32603
        assert error["error"]["message"] == "the agent did not answer initialize within 30 s"
        assert relay.pending(Direction.TO_AGENT) == 0
        late = feed(relay, AGENT, result(b"0"))
        assert sends(late) == []
        assert observed(late, Orphaned)

    def test_an_initialize_answered_in_time_leaves_the_timer_nothing_to_do(self) -> None:
        """The answer is relayed as usual; the timer, when it fires, changes nothing."""
        relay = Relay(initialize_timeout=30.0)
        [timer] = observed_timers(feed(relay, CLIENT, request(b"1", "initialize")))
        assert only_send(feed(relay, AGENT, result(b"0")), CLIENT) == result(b"1")
        assert relay.handle(TimerFired(timer.token, 30.0)) == []

    def test_no_timer_for_other_requests_or_without_a_timeout(self) -> None:
        """Only initialize toward the Agent is bounded, and only with a timeout set."""
        bounded = Relay(initialize_timeout=1.0)
        assert observed_timers(feed(bounded, CLIENT, request(b"1", "session/new"))) == []
        assert observed_timers(feed(bounded, AGENT, request(b"1", "initialize"))) == []
        assert observed_timers(feed(Relay(), CLIENT, request(b"1", "initialize"))) == []

    def test_a_closed_client_gets_nothing(self) -> None:
        """After the Agent left, there is nothing to answer: the request was already abandoned."""
        relay = Relay(initialize_timeout=1.0)
        [timer] = observed_timers(feed(relay, CLIENT, request(b"1", "initialize")))
        relay.handle(PeerClosed(AGENT, 0.5))
        assert relay.handle(TimerFired(timer.token, 1.0)) == []


class TestMaxPending:
    """Rule 9: a peer's pending requests per link and direction are bounded."""

    def test_a_request_past_the_bound_is_answered_an_error_under_its_own_id(self) -> None:
        """Three pending: the fourth is not forwarded, its sender gets -32603 naming the limit;
        the first refusal of a direction is flagged (logged once), the next ones are not."""
        relay = Relay(max_pending=3)
        for n in range(3):
            assert only_send(feed(relay, CLIENT, request(b"%d" % n)), AGENT) == request(b"%d" % n)
        refused = feed(relay, CLIENT, request(b'"four"'))
        error = json.loads(only_send(refused, CLIENT))
        assert error["id"] == "four"
        assert error["error"]["code"] == -32603
        assert "--max-pending" in error["error"]["message"]
        assert error["error"]["data"] == {"limit": "max_pending", "max_pending": 3}
        [seen] = observed(refused, TooManyPending)
        assert (seen.direction, seen.original_id, seen.limit, seen.first) == (
            Direction.TO_AGENT,
            b'"four"',
            3,
            True,
        )
        assert relay.pending(Direction.TO_AGENT) == 3
        again = observed(feed(relay, CLIENT, request(b'"five"')), TooManyPending)
        assert [r.first for r in again] == [False]
        assert not observed(refused, Relayed)

    def test_notifications_and_answers_pass_and_an_answer_makes_room(self) -> None:
        """At the bound, the Client's notifications and its answers to the Agent still go
        through; once the Agent answers one request, the next request is forwarded."""
        relay = Relay(max_pending=1)
        feed(relay, CLIENT, request(b"1"))
        feed(relay, AGENT, request(b"9", "session/request_permission"))
        update = b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"S"}}'
        assert only_send(feed(relay, CLIENT, update), AGENT) == update
        assert only_send(feed(relay, CLIENT, result(b"0")), AGENT) == result(b"9")
        assert only_send(feed(relay, CLIENT, request(b"2")), CLIENT)  # refused
        assert only_send(feed(relay, AGENT, result(b"0")), CLIENT) == result(b"1")
        assert only_send(feed(relay, CLIENT, request(b"2")), AGENT) == request(b"1")

    def test_each_direction_has_its_own_bound(self) -> None:
        """The Client at its bound does not stop the Agent's requests, and the reverse."""
        relay = Relay(max_pending=2)
        for n in range(3):
            feed(relay, CLIENT, request(b"%d" % n))
        assert relay.pending(Direction.TO_AGENT) == 2
        forwarded = feed(relay, AGENT, request(b"7", "fs/read_text_file"))
        assert only_send(forwarded, CLIENT) == request(b"0", "fs/read_text_file")
        assert not observed(forwarded, TooManyPending)

    def test_a_batch_element_past_the_bound_is_answered_apart(self) -> None:
        """In a batch, the requests that fit are forwarded; the others are answered one by one."""
        relay = Relay(max_pending=1)
        commands = feed(relay, CLIENT, b"[" + request(b"1") + b"," + request(b"2") + b"]")
        assert sends(commands) == [
            (CLIENT, sends(commands)[0][1]),
            (AGENT, b"[" + request(b"0") + b"]"),
        ]
        assert json.loads(sends(commands)[0][1])["id"] == 2

    def test_without_a_bound_nothing_is_refused(self) -> None:
        """The default relay (no ``max_pending``) forwards every request."""
        relay = Relay()
        for n in range(2000):
            feed(relay, CLIENT, request(b"%d" % n))
        assert relay.pending(Direction.TO_AGENT) == 2000


def observed_timers(commands: list[Command]) -> list[StartTimer]:
    return [c for c in commands if isinstance(c, StartTimer)]


class TestMetaFor:
    """``meta_for`` (``--otel-propagate``): members written into each forwarded request's
    ``params._meta``; notifications and answers pass as they came."""

    def test_each_forwarded_request_gets_the_members_it_is_given(self) -> None:
        asked: list[tuple[Direction, bytes | None]] = []

        def meta_for(direction: Direction, message: object) -> list[tuple[str, str]]:
            asked.append((direction, getattr(message, "id_token", None)))
            return [("traceparent", f"tp-{len(asked)}")]

        relay = Relay(meta_for=meta_for)
        forwarded = only_send(feed(relay, CLIENT, request(b'"c1"', params=b'{"a":1}')), AGENT)
        assert forwarded == request(b"0", params=b'{"_meta":{"traceparent":"tp-1"},"a":1}')
        asked_back = only_send(feed(relay, AGENT, request(b"7", "fs/read_text_file")), CLIENT)
        assert json.loads(asked_back)["params"] == {"_meta": {"traceparent": "tp-2"}}
        answer = result(b"0", b'{"_meta":{}}')
        assert only_send(feed(relay, AGENT, answer), CLIENT) == result(b'"c1"', b'{"_meta":{}}')
        update = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s"}}'
        assert only_send(feed(relay, AGENT, update), CLIENT) == update
        assert asked == [(Direction.TO_AGENT, b'"c1"'), (Direction.TO_CLIENT, b"7")]

    def test_nothing_given_nothing_written(self) -> None:
        relay = Relay(meta_for=lambda _direction, _message: [])
        sent = request(b"1", params=b'{"_meta":{"x":1}}')
        assert only_send(feed(relay, CLIENT, sent), AGENT) == request(
            b"0", params=b'{"_meta":{"x":1}}'
        )
