"""``kill_agent``: a signal to the Agent once the message was forwarded, maybe later."""

from __future__ import annotations

import signal

import pytest
from action_lab import fault

from proxy.core.actions.base import After
from proxy.core.actions.kill_agent import ACTION, KillAgent
from proxy.core.commands import SignalAgent
from proxy.core.faultfile import FaultFileError, validate_rules


def test_the_signal_follows_the_message() -> None:
    """The signal (by name or number), ``after_ms`` after forwarding; ``respawn`` passed on."""
    [rule] = validate_rules(
        [{"name": "k", "do": {"action": "kill_agent", "signal": "term", "after_ms": 50}}]
    )
    assert isinstance(rule.do, KillAgent)
    assert ACTION.apply(rule.do, fault()) == [After(SignalAgent(int(signal.SIGTERM), False), 0.05)]
    params = KillAgent(action="kill_agent", respawn=True)
    assert ACTION.apply(params, fault()) == [After(SignalAgent(int(signal.SIGKILL), True), 0.0)]


@pytest.mark.parametrize("given", ["NOPE", 0, 99999, True])
def test_no_such_signal_is_refused(given: object) -> None:
    """A signal that does not exist is an error at load."""
    with pytest.raises(FaultFileError, match="signal"):
        validate_rules([{"name": "k", "do": {"action": "kill_agent", "signal": given}}])
