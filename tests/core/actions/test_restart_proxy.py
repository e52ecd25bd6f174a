"""``restart_proxy``: a restart of the data plane once the message was forwarded."""

from __future__ import annotations

import pytest
from action_lab import fault

from proxy.core.actions.base import After
from proxy.core.actions.restart_proxy import ACTION, MAX_DOWNTIME_MS, RestartProxy
from proxy.core.commands import Restart
from proxy.core.faultfile import FaultFileError, validate_rules


def test_the_restart_follows_the_message() -> None:
    """The downtime, in seconds for the shell."""
    params = RestartProxy(action="restart_proxy", downtime_ms=1500)
    assert ACTION.apply(params, fault()) == [After(Restart(1.5))]


@pytest.mark.parametrize("downtime", [-1, MAX_DOWNTIME_MS + 1, float("inf")])
def test_a_downtime_past_an_hour_or_negative_is_refused(downtime: float) -> None:
    """At most an hour (a listener down longer is a mistake), never negative or infinite."""
    with pytest.raises(FaultFileError, match="downtime_ms"):
        validate_rules([{"name": "r", "do": {"action": "restart_proxy", "downtime_ms": downtime}}])
