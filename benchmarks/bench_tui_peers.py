"""The dashboard with many peers: mount, Peers-tab switch and a new round, timed under
Textual's real pilot on a run directory whose round records carry N peers (the recorded
run's rounds, with a real PeerBook's snapshot of N senders in place of their peers).

    .venv/bin/python -m benchmarks.bench_tui_peers [--peers 10000] [--rounds 3]

Prints seconds for each step with the Peers table as shipped (the PeersTable.MOST most
recently seen peers) and, side by side in the same run, with every peer listed and with
10 peers (what the dashboard costs anyway on this machine).
"""
from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import orjson

from benchmarks.harness import parser
from ftis_edge.tui import DashboardApp
from ftis_edge.tui.widgets import PeersTable
from testkit.peer_runs import make_run

async def wait_until(pilot, condition, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the dashboard did not get there")
        await pilot.pause(0.01)


async def measure(run: Path, next_round: dict) -> dict:
    t0 = time.perf_counter()
    app = DashboardApp(run, poll_interval=0.1)
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one(PeersTable)
        await wait_until(pilot, lambda: table.row_count > 0)
        await pilot.pause()
        mount = time.perf_counter() - t0
        t0 = time.perf_counter()
        await pilot.press("5")
        await pilot.pause()
        switch = time.perf_counter() - t0
        t0 = time.perf_counter()
        await pilot.press("1")
        await pilot.pause()
        back = time.perf_counter() - t0
        with open(run / "metrics.jsonl", "ab") as fh:
            fh.write(orjson.dumps(next_round) + b"\n")
        t0 = time.perf_counter()
        await wait_until(pilot, lambda: app.state.last_round == next_round["round"])
        await pilot.pause()
        new_round = time.perf_counter() - t0
        rows = table.row_count
    return {"mount": mount, "to Peers": switch, "to Overview": back, "new round": new_round, "rows": rows}


def main() -> None:
    ap = parser(__doc__, result=False)
    ap.add_argument("--peers", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3, help="round records already in the run")
    args = ap.parse_args()
    shipped = PeersTable.MOST
    print(f"{args.peers} peers, {args.rounds} rounds on file, 160x50")
    print(f"{'table':>22} {'mount s':>8} {'to Peers s':>10} {'to Overview s':>13} {'new round s':>11} {'rows':>6}")
    for label, peers, most in ((f"top {shipped} (shipped)", args.peers, shipped),
                               ("every peer", args.peers, 10 ** 9), ("10 peers (baseline)", 10, shipped)):
        with tempfile.TemporaryDirectory() as tmp:
            run, next_round = make_run(Path(tmp), peers, args.rounds)
            PeersTable.MOST = most
            try:
                got = asyncio.run(measure(run, next_round))
            finally:
                PeersTable.MOST = shipped
        print(f"{label:>22} {got['mount']:8.2f} {got['to Peers']:10.2f} {got['to Overview']:13.2f} "
              f"{got['new round']:11.2f} {got['rows']:6d}")


if __name__ == "__main__":
    main()
