"""What the application is told when something is wrong: where a warning points, and a failing
listener that is heard even when the application configured no logging."""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
import textwrap

import pytest

from kai_session_checkpoint_policy import Host, NoPersistenceWarning, hookimpl, policy

FAILED = "session_event listener 'broken' failed on seq 0 of session 's'"


@pytest.mark.anyio
async def test_the_no_persistence_warning_points_at_the_line_that_opened_the_host() -> None:
    lines: list[int] = []

    async def open_a_host() -> None:
        here = inspect.currentframe()
        assert here is not None
        lines.append(here.f_lineno + 1)
        async with Host([policy], autoload=False):  # the line the warning names
            pass

    with pytest.warns(NoPersistenceWarning) as warned:
        await open_a_host()
    (warning,) = warned
    assert (warning.filename, warning.lineno) == (__file__, lines[0])


class Broken:
    """A listener that raises on every event."""

    @hookimpl
    def session_event(self) -> None:
        raise ValueError("listener bug")


@pytest.mark.anyio
async def test_a_failing_listener_is_logged_where_the_application_listens(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    async with Host(autoload=False) as host:
        host.register(Broken(), name="broken")
        session = host.sessions.create("s")
        with caplog.at_level(logging.ERROR):
            session.append("turn/start", {"turn": 1})
    assert session.events[0].type == "turn/start"  # the append stands
    (record,) = caplog.records
    assert record.getMessage() == FAILED
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "listener bug"
    assert capsys.readouterr().err == ""  # logged once: not to the last resort as well


def test_a_failing_listener_is_not_silent_when_no_logging_is_configured() -> None:
    script = textwrap.dedent(
        """
        import anyio
        from kai_session_checkpoint_policy import Host, hookimpl

        class Broken:
            @hookimpl
            def session_event(self):
                raise ValueError("listener bug")

        async def main():
            async with Host(autoload=False) as host:
                host.register(Broken(), name="broken")
                host.sessions.create("s").append("turn/start", {"turn": 1})
                print("appended")

        anyio.run(main)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert run.stdout == "appended\n"
    lines = run.stderr.splitlines()
    assert lines[0] == FAILED
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: listener bug"
