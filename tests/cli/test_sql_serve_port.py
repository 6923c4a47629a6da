"""`marin sql --serve` on a port something else holds: one line saying so, not a traceback."""

from __future__ import annotations

import socket

import pytest

from marin_dagster.cli import main
from marin_dagster.execution.instance import ensure_home


def test_a_port_in_use_is_one_line_and_a_failure(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "data"))
    monkeypatch.setenv("DAGSTER_HOME", ensure_home(str(tmp_path / "home")))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        capsys.readouterr()
        code = main(["sql", "--serve", "--host", "127.0.0.1", "--port", str(port)])
    err = capsys.readouterr().err
    assert code != 0
    line = f"marin sql: port {port} on 127.0.0.1 is already in use"
    assert line in err and "--port" in err
    assert "Traceback" not in err and "Errno" not in err


def test_a_host_not_of_this_machine_is_one_line_and_a_failure(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "data"))
    monkeypatch.setenv("DAGSTER_HOME", ensure_home(str(tmp_path / "home")))
    capsys.readouterr()
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): no machine has it, so the bind is refused.
    code = main(["sql", "--serve", "--host", "192.0.2.1", "--port", "0"])
    err = capsys.readouterr().err
    assert code != 0
    assert "marin sql: cannot listen on --host 192.0.2.1" in err and "Traceback" not in err


def test_a_port_out_of_range_is_one_line(capsys):
    """--port 99999 ended in OverflowError's traceback."""
    for port in ("99999", "-1", "http"):
        with pytest.raises(SystemExit) as exit_:
            main(["sql", "--serve", "--port", port])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "Traceback" not in err
        assert f"argument --port: {port!r} is not a port: give 0-65535" in err
