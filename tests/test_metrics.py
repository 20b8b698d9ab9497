"""The run directory's metrics file: append, follow across torn lines, control file."""
import math

from ftis_edge.metrics import records as m


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


def test_the_round_records_of_a_run_leave_its_markers_out(tmp_path):
    w = m.MetricsWriter(tmp_path)
    for rec in ({"type": "start"}, {"round": 1}, {"type": "stop", "round": 1}, {"type": "start"}, {"round": 2}):
        w.write(rec)
    assert [r["round"] for r in m.read_rounds(tmp_path)] == [1, 2]
    assert m.round_records(m.read_metrics(tmp_path)) == m.read_rounds(tmp_path)
    assert m.read_rounds(tmp_path / "none") == []


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


# ---- the metric registry (ftis_edge/metrics/metric_keys.py) -------------------------------------------
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from ftis_edge.metrics import metric_keys as mk  # noqa: E402
from ftis_edge.learn.objective import ftis_loss  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "recorded_run"


def test_generated_docs_are_up_to_date():
    """docs/metrics.md, docs/trl.md, docs/models.md and docs/config.md are generated: edit the source."""
    out = subprocess.run([sys.executable, "docs/make_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8") == mk.render_metrics_doc()


def test_every_registered_metric_is_documented_once_with_a_known_rule():
    doc = mk.render_metrics_doc()
    for name, key in mk.METRICS.items():
        assert doc.count(f"| `{name}` |") == 1, name
        assert key.rule in mk.RULE_TEXT and key.meaning
        if key.rule == mk.FRACTION:
            assert mk.METRICS[key.of].rule == mk.SUM, name
    assert sum(len(ms) for ms in mk.SECTIONS.values()) == len(mk.METRICS)      # no name twice
    for old, (new, _) in mk.RENAMED_METRICS.items():
        assert old not in mk.METRICS and new in mk.METRICS, old


def test_every_objective_stat_has_a_micro_batch_rule():
    logp = torch.tensor([[-0.5, -1.0], [-0.2, 0.0]])
    _, stats = ftis_loss(logp, logp - 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool))
    stats.pop("per_sample")
    for key in stats:
        assert mk.rule(key) in mk.MICRO_BATCH_RULES, key
    with pytest.raises(mk.UnregisteredMetric, match="not registered"):
        mk.rule("reward/mean")


# keys registered after tests/data/recorded_run was recorded (re-record it to empty this set)
ADDED_SINCE_THE_RECORDING = {"peers/groups_used", "relay/state", "relay/reason",
                             "samples/span_level", "spans", "sampling/span_logp_difference/mean",
                             # issue 28: batch fill, peer choice, compute accounting
                             "groups/own", "groups/topped_up", "peers/share", "peers/saved_frac",
                             "peers/skipped_zero_advantage", "peers/skipped_peer_cap", "peers/skipped_surplus",
                             "gen/tokens_total", "cpu/gen_s", "cpu/grade_s", "cpu/intake_s", "cpu/train_s",
                             "cpu/sync_s", "cpu/round_s", "cpu/total_s", "reward/timed_out", "reward/refused",
                             # issue 25: the plausibility filter
                             "trust/implausible", "trust/threshold", "trust/repeated_tokens",
                             # issue 62 item 2: the direction bound on another tokenizer's text (opt-in)
                             "trust/direction_kept", "trust/direction_min_scale",
                             # the held-out eval and the swarm guard
                             *(k for k in mk.METRICS if k.startswith(("eval/", "swarm/guard"))), "time/eval_s",
                             # another model's samples (docs/ftis.md)
                             "samples/foreign", "is/foreign_capped", "peers/refused_length",
                             "peers/success_weight", "samples/masked_truncated", "peers/false_tokenizer_claims",
                             "peers/refused_untokenizable",
                             # a node's own training diverging (its KL, format, length)
                             "kl/own_mean", "train/diverging",
                             # issue 48: what the swarm is worth (worth.py, outcomes.py)
                             "groups/own_signal_frac", "prompts/from_outcomes", "prompts/predicted_signal",
                             *(k for k in mk.METRICS if k.startswith("worth/")),
                             # issue 65: kin, not crowds (kin.py), the real saving, another tokenizer skipped
                             *(k for k in mk.METRICS if k.startswith("kin/")), "peers/saved_groups",
                             "peers/skipped_other_tokenizer",
                             # issue 66: hints (a pilot)
                             *(k for k in mk.METRICS if k.startswith("hints/"))}


def test_the_recorded_fixture_uses_only_registered_keys():
    rounds = m.read_rounds(FIXTURE)
    assert rounds
    for r in rounds:
        assert mk.unregistered(r) == [], r["round"]
        for peer in r["peers"].values():
            assert set(peer) <= set(mk.PEER_FIELDS)   # recorded before later peer-book fields
    # and the real swarm run wrote every registered key at least once: none is dead
    assert set(mk.METRICS) - {k for r in rounds for k in r} <= ADDED_SINCE_THE_RECORDING


def test_every_peer_book_field_is_documented():
    from ftis_edge.peers.book import PeerBook
    book = PeerBook(quarantine_after=5)
    book.get("alice")
    assert set(book.snapshot()["alice"]) == set(mk.PEER_FIELDS)
