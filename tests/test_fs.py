"""marin_dagster/fs.py: atomic writes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO


def test_a_write_the_disk_refuses_names_the_file(tmp_path):
    """A full disk (or a file size limit) is reported when the file is flushed or closed,
    where Python gives no file name: the error names the file the step was writing, and
    nothing is left under its name or beside it."""
    target = tmp_path / "out" / "part-0.bin"
    # RLIMIT_FSIZE makes the kernel refuse a write past 64 KiB with EFBIG, as a full disk
    # refuses it with ENOSPC; in a child process so pytest's own files are not limited.
    script = textwrap.dedent(
        f"""
        import resource, signal
        from marin_dagster import fs
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
        try:
            fs.write_bytes({str(target)!r}, b"x" * 1_000_000)
        except OSError as e:
            print(repr(str(e)))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "File too large" in proc.stdout and str(target) in proc.stdout, proc.stdout
    assert list((tmp_path / "out").iterdir()) == []
