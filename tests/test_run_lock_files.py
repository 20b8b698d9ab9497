"""A node.lock someone else put in a shared run directory (issue 51 item 4): a symlink to a user's
file, a FIFO, a hard link. Before: `start --resume` truncated and rewrote the linked file (even
though the resume then failed) and a FIFO gave a traceback. Now each is refused in one line and
the user's file is untouched (real CLI processes, real files)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ftis_edge.store import runlock
from procs import ROOT, write_config

USER_TEXT = "my thesis, chapter 1\n"


def start_resume(cfg) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftis_edge.cli", "start", str(cfg), "--headless", "--resume"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture
def shared(tmp_path):
    cfg = write_config(tmp_path, "alice")
    run = tmp_path / "alice"
    run.mkdir()
    victim = tmp_path / "thesis.txt"
    victim.write_text(USER_TEXT)
    return cfg, run, victim


def refused_in_one_line(out, *words):
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("ftis-edge: error: ") and all(w in err for w in words), err


def test_a_symlinked_lock_is_refused_and_its_target_untouched(shared):
    cfg, run, victim = shared
    (run / runlock.LOCK_FILE).symlink_to(victim)
    refused_in_one_line(start_resume(cfg), "node.lock is a symbolic link", "remove it")
    assert victim.read_text() == USER_TEXT
    with pytest.raises(runlock.LockFileError):
        runlock.holder(run)
    dangling = run.parent / "nowhere"                  # a link to a file not there yet: not created
    (run / runlock.LOCK_FILE).unlink()
    (run / runlock.LOCK_FILE).symlink_to(dangling)
    with pytest.raises(runlock.LockFileError, match="symbolic link"):
        runlock.acquire(run)
    assert not dangling.exists()


def test_a_fifo_lock_is_refused_not_a_traceback(shared):
    cfg, run, _ = shared
    os.mkfifo(run / runlock.LOCK_FILE)
    refused_in_one_line(start_resume(cfg), "node.lock is not a regular file")
    with pytest.raises(runlock.LockFileError):
        runlock.holder(run)


def test_a_hard_linked_lock_is_refused(shared):
    cfg, run, victim = shared
    os.link(victim, run / runlock.LOCK_FILE)
    refused_in_one_line(start_resume(cfg), "hard links")
    assert victim.read_text() == USER_TEXT


def test_a_crafted_holder_note_reaches_the_message_only_as_a_pid(tmp_path):
    """The note is read through the locked descriptor; strings with escapes are dropped."""
    run = tmp_path / "r"
    run.mkdir()
    (run / runlock.LOCK_FILE).write_text(json.dumps({"pid": "\x1b]52;c;AAAA\x07", "started": "\x1b[2J"}))
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
                               str(run / runlock.LOCK_FILE)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert runlock.holder(run) == {}
        with pytest.raises(runlock.RunLocked) as e:
            runlock.acquire(run)
        assert "\x1b" not in str(e.value) and str(e.value).startswith("another node is running")
    finally:
        holder.kill()
        holder.wait()


def test_a_plain_lock_still_works(tmp_path):
    run = tmp_path / "r"
    runlock.acquire(run)
    try:
        info = runlock.holder(run)
        assert info["pid"] == os.getpid()
    finally:
        runlock.release()
    assert runlock.holder(run) is None
