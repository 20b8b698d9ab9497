"""Start a node from a model you trained (issue 49.1): export the merged model, point model.spec at
it. Real weights end to end: the default node's one trained round (conftest.lora_run), its merged
F16 GGUF, and a new node started from that file."""
from __future__ import annotations

import json

import pytest

from ftis_edge.learn.batch import SampleRules
from ftis_edge.peers.worth import SAME_TOKENIZER, peer_kind


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_node_starts_from_its_merged_export_as_same_tokenizer_another_base_model(tmp_path, lora_run):
    from ftis_edge.export import export_run
    from ftis_edge.metrics.records import read_metrics, round_records
    from ftis_edge.models.resolve import resolve_model
    from procs import run_node, write_config

    export_run(lora_run, tmp_path / "out", quant="f16", eval_limit=4, threads=1, log=lambda *_: None, latest=True)
    merged = tmp_path / "out" / "model-f16.gguf"
    assert merged.is_file()

    base, mine = resolve_model("smollm2-135m"), resolve_model(str(merged))
    assert mine.fingerprint != base.fingerprint                       # its own weights
    assert mine.tokenizer_fingerprint == base.tokenizer_fingerprint   # its base's tokenizer

    # a new node on it: trains, and says who it is in its start record (what peers see on the wire)
    cfg = write_config(tmp_path, "expert", model={"spec": str(merged), "threads": 1},
                       node={"rounds": 1, "checkpoint_every": 1}, eval={"every": 0})
    run_node(cfg, timeout=1800)
    records = read_metrics(tmp_path / "expert")
    start = next(r for r in records if r.get("type") == "start")
    assert (start["model_fp"], start["tokenizer_fp"]) == (mine.fingerprint, base.tokenizer_fingerprint)
    assert any(r.get("version") == 1 for r in round_records(records)), json.dumps(records[-1])[:400]

    # to a node on the base model, its groups are "same tokenizer, another base model": token-level
    # F-TIS (no re-tokenizing), marked as another model's (the guard's level 3 can drop them)
    assert peer_kind(True, start["model_fp"], base.fingerprint) == SAME_TOKENIZER

    class Group:                # the intake's PeerGroup, as far as SampleRules reads it
        same_tokenizer = True
        rollout = type("R", (), {"model_fp": start["model_fp"]})()
    assert SampleRules(model_fp=base.fingerprint).is_foreign(Group())
