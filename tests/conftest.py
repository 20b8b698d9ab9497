import os
import sys

# tests/ holds shared helpers (procs.py) imported by several test files.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import pytest  # noqa: E402


@pytest.fixture
def relay():
    """``relay(*flags, keys=None, port=None, log_level="WARNING")``: a real relay process on
    loopback, ready to answer; every one started is killed at the end of the test."""
    from procs import RelayProc
    procs = []

    def make(*args, keys=None, port=None, log_level="WARNING"):
        r = RelayProc(*args, port=port, log_level=log_level)
        procs.append(r)
        r.wait_ready(keys)
        return r
    yield make
    for r in procs:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()
