"""The run directory's metrics file: append, follow across torn lines, control file."""
import math

from ftis_edge import metrics as m


def test_follow_sees_only_complete_lines(tmp_path):
    w = m.MetricsWriter(tmp_path)
    f = m.MetricsFollower(tmp_path)
    assert f.poll() == []
    w.write({"round": 1, "reward/own": 0.5, "loss": float("nan")})
    got = f.poll()
    assert len(got) == 1 and got[0]["round"] == 1 and got[0]["loss"] is None and got[0]["type"] == "round"
    with open(tmp_path / m.METRICS_FILE, "ab") as fh:       # a torn write
        fh.write(b'{"type": "round", "round": 2')
    assert f.poll() == []
    with open(tmp_path / m.METRICS_FILE, "ab") as fh:
        fh.write(b', "reward/own": 1.0}\nnot json\n')
    got = f.poll()
    assert [r["round"] for r in got] == [2]
    assert [r["round"] for r in m.read_metrics(tmp_path)] == [1, 2]


def test_control_file_is_atomic_and_defaults(tmp_path):
    assert m.read_control(tmp_path) == {"pause": False, "stop": False}
    m.write_control(tmp_path, pause=True)
    assert m.read_control(tmp_path) == {"pause": True, "stop": False}
    m.write_control(tmp_path, stop=True)
    assert m.read_control(tmp_path) == {"pause": True, "stop": True}
    (tmp_path / m.CONTROL_FILE).write_text("{garbage")
    assert m.read_control(tmp_path) == {"pause": False, "stop": False}


def test_nested_non_finite_values_become_null(tmp_path):
    w = m.MetricsWriter(tmp_path)
    w.write({"peers": {"a": {"kl_mean": math.inf, "x": [1.0, float("nan")]}}})
    rec = m.read_metrics(tmp_path)[0]
    assert rec["peers"]["a"]["kl_mean"] is None and rec["peers"]["a"]["x"] == [1.0, None]
