"""Write-temp-then-rename (ftis_edge.common.atomic): the old version or the new one, never half."""
from __future__ import annotations

import pytest

from ftis_edge.common import atomic
from ftis_edge.store import checkpoint


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_file_replaces_and_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "sub" / "a.json"
    atomic.write_text(path, "old")
    atomic.write_bytes(path, b"new", durable=True)
    assert path.read_bytes() == b"new"

    def half_then_crash(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic.write_file(path, half_then_crash)
    assert path.read_text() == "new" and leftovers(path.parent) == []


def test_write_dir_replaces_or_keeps_the_winner_of_a_race(tmp_path):
    target = tmp_path / "cache-entry"
    atomic.write_dir(target, lambda d: (d / "x").write_text("1"))
    atomic.write_dir(target, lambda d: (d / "y").write_text("2"), durable=True)
    assert sorted(p.name for p in target.iterdir()) == ["y"]           # replaced
    atomic.write_dir(target, lambda d: (d / "z").write_text("3"), keep_existing=True)
    assert sorted(p.name for p in target.iterdir()) == ["y"]           # the existing one won
    with pytest.raises(ValueError):
        atomic.write_dir(tmp_path / "other", lambda d: (_ for _ in ()).throw(ValueError("bad")))
    assert not (tmp_path / "other").exists() and leftovers(tmp_path) == []


def test_checkpoints_keep_the_last_two_complete_rounds(tmp_path):
    for r in (1, 2, 3):
        checkpoint.save(tmp_path, r, {"round": r})
    assert checkpoint.complete(tmp_path) == [2, 3]
    assert checkpoint.load_latest(tmp_path) == {"round": 3}
    assert leftovers(tmp_path / "checkpoints") == []


BUILDER = """
import os, sys, time
from pathlib import Path
from ftis_edge.common import atomic
target, log = Path(sys.argv[1]), Path(sys.argv[2])

def build():
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(1.0)                             # a slow conversion
    atomic.write_text(target, "built")
atomic.build_once(target, target.exists, build)
print(target.read_text())
"""


def test_one_builder_lets_one_of_several_processes_build_a_cache_entry(tmp_path):
    import subprocess
    import sys
    target, log = tmp_path / "cache" / "model.f16.gguf", tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(target), str(log)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    assert outs == ["built"] * 4                      # every process got the entry
    assert len(log.read_text().split()) == 1           # and only one built it


def test_a_builder_killed_mid_way_frees_the_lock(tmp_path):
    import signal
    import subprocess
    import sys
    target = tmp_path / "entry"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from ftis_edge.common import atomic\n"
        "with atomic.one_builder(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)"), str(target)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    with atomic.one_builder(target):                   # does not hang: the lock died with its holder
        atomic.write_text(target, "mine")
    assert target.read_text() == "mine"
