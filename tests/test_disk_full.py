"""A full disk is named: "disk full", the path, the free space needed; checked before round 1 and
before each checkpoint (a real tmpfs of a few MB; needs root to mount, skipped otherwise)."""
from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager

import pytest

from ftis_edge.store import diskspace
from procs import cli, write_config


@contextmanager
def small_disk(path, mb: int):
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(path)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_a_write_that_meets_a_full_disk_is_named(tmp_path):
    with small_disk(tmp_path / "disk", 1) as disk:
        with pytest.raises(OSError) as info:
            with open(disk / "latest.gguf", "wb") as fh:
                fh.write(b"\0" * (2 << 20))
        assert diskspace.is_disk_full(info.value)
        msg = str(diskspace.explain(info.value, disk, need=20_000_000, kept="the checkpoint of round 3 is kept"))
        assert msg.startswith(f"disk full: writing {disk}") and "failed (No space left on device);" in msg
        assert "this run needs about 21.0 MB there; the checkpoint of round 3 is kept" in msg
        with pytest.raises(diskspace.DiskFull, match=r"disk full: a checkpoint needs 6.0 MB in .*, only 0 bytes free"):
            diskspace.require(disk, 5_000_000, "a checkpoint")


@pytest.mark.model
@pytest.mark.timeout(300)
def test_a_run_dir_on_a_12mb_disk_is_refused_before_round_1(tmp_path):
    cfg = write_config(tmp_path, "d", node={"rounds": 3, "checkpoint_every": 1}, eval={"every": 0})
    with small_disk(tmp_path / "disk", 12) as disk:
        out = cli("start", str(cfg), "--headless", "--run-dir", str(disk / "run"))
        assert out.returncode == 2, out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ftis-edge: error: disk full: a checkpoint and this model's weights needs "), last
        assert f"in {disk / 'run'}, only " in last and "no round is lost" in last and "--resume" in last
        assert "Traceback" not in out.stderr
