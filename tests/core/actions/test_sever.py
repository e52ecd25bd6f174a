"""``sever``: a cut before forwarding (the message lost) or after it; ``when`` is an old name."""

from __future__ import annotations

import pytest
from action_lab import fault

from proxy.core.actions.base import Cut, Stop
from proxy.core.actions.sever import ACTION, Sever
from proxy.core.faultfile import FaultFileError, validate_rules


def test_before_forwarding_the_message_is_lost() -> None:
    """A cut before: the message stops, as severed."""
    params = Sever(action="sever", side="client", moment="before", close_code=4000)
    assert ACTION.apply(params, fault()) == [Cut("client", True, 4000), Stop("severed")]


def test_after_forwarding_the_message_goes_first() -> None:
    """A cut after: nothing stops the message."""
    params = Sever(action="sever", moment="after")
    assert ACTION.apply(params, fault()) == [Cut("both", False, 1001)]


def test_the_old_name_of_moment_loads_with_a_note() -> None:
    """``when`` still loads as ``moment``, with a note; both together are an error."""
    [rule] = validate_rules([{"name": "s", "do": {"action": "sever", "when": "after"}}])
    assert isinstance(rule.do, Sever)
    assert rule.do.moment == "after"
    assert [field for field, _ in ACTION.notes(rule.do)] == ["do.when"]
    with pytest.raises(FaultFileError, match="give 'moment' only"):
        validate_rules([{"name": "s", "do": {"action": "sever", "when": "a", "moment": "b"}}])


@pytest.mark.parametrize("code", [999, 1005, 1015, 2000, 5000])
def test_close_codes_no_endpoint_may_send_are_refused(code: int) -> None:
    """RFC 6455 7.4: reserved and unassigned codes cannot be sent."""
    with pytest.raises(FaultFileError, match="close_code"):
        validate_rules([{"name": "s", "do": {"action": "sever", "close_code": code}}])
