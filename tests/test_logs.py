"""node.log gets every ftis_edge logger (the swarm's relay warnings included); the console
gets one line per record, never a traceback; the headless round line says what happened."""
from __future__ import annotations

import logging

import zmq

from relay import client
from ftis_edge.run.logs import round_line, setup_logging
from relay.waker import Waker


def _flush():
    for h in logging.getLogger("ftis_edge").handlers:
        h.flush()


def test_module_loggers_reach_node_log_and_tracebacks_stay_out_of_the_console(tmp_path, capsys):
    setup_logging(tmp_path, console=True)
    try:
        # the relay client lives beside the package (relay.client); its warnings are the node's too
        assert client.log.name == "relay.client"
        client.log.warning("relay restarted (epoch abc): re-publishing 3 acked rollouts")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("ftis_edge.run.node").error("failed: boom", exc_info=True)
        logging.getLogger("ftis_edge.run.node").error("file only", extra={"console": False})
        _flush()
        log = (tmp_path / "node.log").read_text()
        assert "relay restarted (epoch abc)" in log
        assert "Traceback (most recent call last)" in log and "file only" in log
        console = capsys.readouterr().err
        assert "relay restarted" in console and "failed: boom" in console
        assert "Traceback" not in console and "file only" not in console
    finally:
        for name in ("ftis_edge", "relay"):
            for h in list(logging.getLogger(name).handlers):
                logging.getLogger(name).removeHandler(h)
                h.close()


def test_round_line_names_accuracy_speed_peers_and_a_skipped_step():
    rec = {"round": 3, "reward/own": 0.375, "reward/peers": 0.5, "accuracy/own": 0.25, "loss": 0.0123,
           "filter/dropped": 2, "gen/tok_s": 412.4, "peers/groups_received": 4, "peers/groups_used": 2,
           "peers/rejected": 1, "peers/stale": 0, "time/round_s": 8.14, "skipped": 0.0}
    assert round_line(rec, swarm=True) == (
        "round 3: reward 0.375 (peers 0.500), accuracy 25%, loss 0.0123, dropped 2, 412 tok/s, "
        "peer groups 4 received / 2 used / 1 dropped, 8.1 s")
    rec = {"round": 4, "reward/own": 0.0, "accuracy/own": 0.0, "skipped": 1, "samples": 0,
           "frac_reward_zero_std": 1.0, "gen/tok_s": 405.0, "time/round_s": 7.9}
    assert round_line(rec, swarm=False) == (
        "round 4: reward 0.000, accuracy 0%, no optimiser step (every group had equal rewards), 405 tok/s, 7.9 s")


def test_the_waker_wakes_a_zmq_poller_from_another_thread():
    w = Waker()
    poller = zmq.Poller()
    poller.register(w.fileno(), zmq.POLLIN)
    try:
        assert dict(poller.poll(0)) == {}
        w.wake()
        assert w.fileno() in dict(poller.poll(5000))     # woken: without the wake the poll returns empty
        w.drain()
        assert dict(poller.poll(0)) == {}
    finally:
        w.close()
    assert w.closed
