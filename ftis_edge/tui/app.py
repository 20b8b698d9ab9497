"""The ftis-edge dashboard: a Textual app that follows a run directory.

It only reads files (metrics.jsonl, node.log, config.toml) on a timer and writes
control.json when a key asks it to, so it can never slow the training loop down: the node
runs in its own process and does not know whether anyone is watching.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.geometry import Size
from textual.widgets import DataTable, Footer, Header, Log, Static, TabbedContent, TabPane

from ftis_edge.metrics import LOG_FILE, MetricsFollower, read_control, write_control
from ftis_edge.rundir import last_error_line
from ftis_edge.tui import format as fmt
from ftis_edge.tui.state import LogTail, RunState, flatten, load_config
from ftis_edge.tui.widgets import (
    ALL,
    GREEN,
    OWN,
    PEERS,
    RED,
    VIOLET,
    YELLOW,
    Headline,
    HelpScreen,
    MetricPanel,
    Packed,
    PeersTable,
    Series,
    field,
    peer_detail,
    relay_chunks,
)

TABS = [("tab-overview", "Overview"), ("tab-filter", "Filter & IS"), ("tab-kl", "KL & loss"),
        ("tab-speed", "Throughput"), ("tab-peers", "Peers"), ("tab-config", "Config"),
        ("tab-log", "Log")]
TALL, WIDE = 40, 140         # from this many rows / columns the overview shows more panels
FINISHED = "#90caf9"

# Panel contents, shared by a panel's own tab and its copy on a large overview.
REWARD = [Series("reward/own", "own", OWN, mean=True), Series("reward/peers", "peers", PEERS),
          Series("reward", "all", ALL)]
ACCURACY = [Series("accuracy/own", "accuracy", OWN, fmt.pct, mean=True),
            Series("format/own", "format", VIOLET, fmt.pct)]
FILTER = [Series("filter/adv_le0_frac", "Â≤0", YELLOW, fmt.pct),
          Series("filter/kl_gt_g_frac", "KL>g", VIOLET, fmt.pct),
          Series("filter/dropped_frac", "dropped", RED, fmt.pct)]
IS = [Series("sampling/importance_sampling_ratio/mean", "w mean", OWN),
      Series("is/truncated_frac", "truncated", RED, fmt.pct),
      Series("is/ess", "ESS", GREEN, fmt.pct)]
KL = [Series("kl/mean", "KL", OWN, lambda v: fmt.num(v, 4)),
      Series("sampling/sampling_logp_difference/mean", "|ℓ−g|", VIOLET, lambda v: fmt.num(v, 4))]
LOSS = [Series("loss", "loss", OWN, lambda v: fmt.num(v, 4)),
        Series("grad_norm", "grad", YELLOW, plot=False),
        Series("clip_ratio/region_mean", "clip", ALL, fmt.pct, plot=False)]
TOKS = [Series("gen/tok_s", "tok/s", OWN, fmt.integer, mean=True),
        Series("completions/mean_length", "len", ALL, lambda v: fmt.num(v, 1), plot=False)]
TIMES = [Series("time/train_s", "train", PEERS, fmt.seconds, mean=True),
         Series("time/gen_s", "gen", OWN, fmt.seconds), Series("time/round_s", "round", ALL, fmt.seconds)]


class DashboardApp(App[int]):
    """Follows RUN_DIR live; ``node_process`` is the node's Popen when we started it."""

    CSS_PATH = "dashboard.tcss"
    TITLE = "ftis-edge"
    BINDINGS = [
        Binding("q", "stop", "stop"),
        Binding("p", "toggle_pause", "pause"),
        Binding("d", "detach", "detach"),
        Binding("question_mark", "help", "help"),
        Binding("left_square_bracket", "next_tab(-1)", "previous tab", show=False),
        Binding("right_square_bracket", "next_tab(1)", "next tab", show=False),
        *[Binding(str(i), f"show_tab('{tab}')", label, show=False)
          for i, (tab, label) in enumerate(TABS, start=1)],
    ]

    def __init__(self, run_dir: str | os.PathLike, node_process: subprocess.Popen | None = None,
                 *, poll_interval: float = 0.5, node_stderr: tuple[Path, int] | None = None) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.node_process = node_process
        self.node_stderr = node_stderr         # (file, offset) where the node's one-line error lands
        self.failure: str | None = None        # that line, once the node has failed
        self._relay_problem: str | None = None
        self.poll_interval = poll_interval
        self.state = RunState()
        self.follower = MetricsFollower(self.run_dir)
        self.log_tail = LogTail(self.run_dir / LOG_FILE)
        self.control = read_control(self.run_dir)
        self.node_exit: int | None = None     # the node process's exit code once it has ended
        self.stop_pressed = False
        self._config_key: tuple | None = None
        self._mounted_once = False             # resize events can come before the widgets exist

    # ---- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Headline(id="headline")
        with TabbedContent(initial="tab-overview"):
            with TabPane("Overview", id="tab-overview"):
                with Horizontal(classes="row"):
                    yield MetricPanel("reward", REWARD, ylim=(0, 1), id="panel-reward")
                    yield MetricPanel("accuracy", ACCURACY, ylim=(0, 1), id="panel-accuracy")
                    yield MetricPanel("loss", LOSS, id="ov-loss", classes="wide-only")
                with Horizontal(classes="row tall-only"):
                    yield MetricPanel("filter rates", FILTER, ylim=(0, 1), id="ov-filter")
                    yield MetricPanel("importance weights", IS, id="ov-is")
                    yield MetricPanel("KL · log-prob mismatch", KL, id="ov-kl", classes="wide-only")
            with TabPane("Filter & IS", id="tab-filter"):
                with Horizontal(classes="row"):
                    yield MetricPanel("filter rates", FILTER, ylim=(0, 1), id="panel-filter")
                    yield MetricPanel("importance weights", IS, id="panel-is")
            with TabPane("KL & loss", id="tab-kl"):
                with Horizontal(classes="row"):
                    yield MetricPanel("KL · log-prob mismatch", KL, id="panel-kl")
                    yield MetricPanel("loss", LOSS, id="panel-loss")
            with TabPane("Throughput", id="tab-speed"):
                with Vertical():
                    with Horizontal(classes="row"):
                        yield MetricPanel("generation", TOKS, id="panel-toks")
                        yield MetricPanel("time per round", TIMES, id="panel-time")
                    yield Packed(id="speed-wire")
            with TabPane("Peers", id="tab-peers"):
                with Vertical():
                    yield Packed(id="relay-status")
                    yield PeersTable(id="peers-table")
                    yield Packed(id="peer-detail")
            with TabPane("Config", id="tab-config"):
                with Vertical():
                    yield Static(id="config-source")
                    yield DataTable(id="config-table", cursor_type="row")
            with TabPane("Log", id="tab-log"):
                yield Log(id="log", max_lines=5000)
        yield Footer()

    def on_mount(self) -> None:
        self.main_screen = self.screen
        table = self.query_one("#config-table", DataTable)
        table.add_column("key", key="key")
        table.add_column("value", key="value")
        self._apply_size(self.size)
        self._mounted_once = True
        self.refresh_all()                     # "waiting for metrics…" until the first record
        self.poll()                            # draw what is already there before the first tick
        self.set_interval(self.poll_interval, self.poll)

    def on_resize(self, event) -> None:
        self._apply_size(event.size)
        self.call_after_refresh(self.refresh_all)     # panels that just appeared are stale

    def _apply_size(self, size: Size) -> None:
        screen = getattr(self, "main_screen", self.screen)
        screen.set_class(size.height >= TALL, "-tall")
        screen.set_class(size.width >= WIDE, "-wide")

    # ---- following the run ---------------------------------------------------------------
    def poll(self) -> None:
        """Read what the node appended since the last tick and redraw what changed."""
        changed = self.state.ingest(self.follower.poll())
        lines = self.log_tail.poll()
        if lines:
            self.query_one("#log", Log).write_lines(lines)
        control = read_control(self.run_dir)  # another dashboard may have changed it
        if control != self.control:
            self.control, changed = control, True
        if self.node_process is not None and self.node_exit is None:
            code = self.node_process.poll()
            if code is not None:
                self.node_exit, changed = code, True
                self.state.ingest(self.follower.poll())   # its last records
                if self.stop_pressed:
                    self.exit(code, return_code=code)
                    return
                if code != 0:
                    self._show_failure(code)
        if self.stop_pressed and self.node_process is None and self.state.finished:
            self.exit(0)                       # watching: the node stopped as asked
            return
        if self.failure is None and (self.state.stop or {}).get("reason") == "error":
            self._show_failure(None)           # watching a node that failed
        # relay health (SwarmClient.health() in each round record): a relay that turns unreachable is said once in the Log tab
        problem = relay_unreachable(self.state.latest)
        if problem != self._relay_problem:
            self._relay_problem = problem
            if problem:
                self.query_one("#log", Log).write_line(f"relay {problem}")
        if changed:
            self.refresh_all()
        self._refresh_config()

    def _show_failure(self, code: int | None) -> None:
        """The node failed: its one-line reason on screen (toast, header, Log tab); the
        traceback is in node.log, which the Log tab follows."""
        line = (self.state.stop or {}).get("error")
        if not line and self.node_stderr is not None:
            line = last_error_line(*self.node_stderr)
        self.failure = line or f"the node exited with code {code}"
        self.notify(f"{self.failure} (traceback: Log tab / node.log)", title="node failed",
                    severity="error", timeout=30)
        self.query_one("#log", Log).write_line(f"node failed: {self.failure}")
        self.refresh_all()

    def status(self) -> tuple[str, str, str]:
        """(short word, colour, sentence) for the headline and the header."""
        st = self.state
        if self.failure is not None:
            word = "failed" if self.node_exit is None else f"exited {self.node_exit}"
            return word, RED, f"failed: {self.failure}"
        if st.finished:
            reason, last = fmt.text(st.stop.get("reason")), fmt.integer(st.stop.get("round"))
            return "finished", FINISHED, f"finished ({reason}) after round {last}"
        if self.node_exit is not None:
            colour = RED if self.node_exit else ""
            return f"exited {self.node_exit}", colour, f"node exited with code {self.node_exit}"
        if self.control["stop"]:
            return "stopping…", YELLOW, "stopping after this round…"
        if self.control["pause"]:
            return "paused", YELLOW, "paused: p to resume"
        if st.start is None and not st.rounds:
            return "waiting…", "", "waiting for metrics…"
        relay_problem = relay_unreachable(st.latest)
        if relay_problem:
            return "running", YELLOW, f"running · relay {relay_problem}"
        return "running", GREEN, "running"

    def refresh_all(self) -> None:
        """Redraw every widget from the state (plots only where they are visible)."""
        if not self._mounted_once:
            return
        st = self.state
        word, colour, sentence = self.status()
        node, model = st.identity("node_id"), st.identity("model")
        self.title = "ftis-edge" + (f" · {fmt.text(node, 32)}" if node else "")
        # the state first: a narrow header cuts the end of the line
        self.sub_title = sentence + (f" · {fmt.text(model, 40)} {fmt.text(st.identity('trainable'))}"
                                     if model else "")
        self.query_one(Headline).update_from(st, word, colour)
        for panel in self.query(MetricPanel):
            # plots in hidden tabs are redrawn when their tab shows (see tab_activated)
            panel.update_from(st, plot=bool(panel.region.width))
        self.query_one("#speed-wire", Packed).show(self._wire_chunks())
        self.query_one("#relay-status", Packed).show(relay_chunks(st))
        table = self.query_one(PeersTable)
        table.update_from(st)
        self._show_peer_detail(table)

    def _wire_chunks(self) -> list[Content]:
        latest = self.state.latest
        return [field("wire out", f"{fmt.num(latest.get('wire/bytes_per_token_out'), 2)} B/tok"),
                field("in", f"{fmt.num(latest.get('wire/bytes_per_token_in'), 2)} B/tok"),
                field("tokens", fmt.integer(latest.get("gen/tokens"))),
                field("sync", fmt.seconds(latest.get("time/sync_s"))),
                field("peer wait", fmt.seconds(latest.get("time/peer_wait_s"))),
                field("micro-batch", fmt.integer(latest.get("micro_batch"))),
                field("OOM retries", f"{fmt.integer(latest.get('memory/oom_retries'))} total")]  # cumulative

    def _refresh_config(self) -> None:
        config, source = load_config(self.run_dir, self.state.start)
        key = (id(self.state.start), source, repr(config) if source != "start record" else "")
        if key == self._config_key:
            return
        self._config_key = key
        self.query_one("#config-source", Static).update(f"config from {source}")
        table = self.query_one("#config-table", DataTable)
        table.clear()
        start = self.state.start or {}
        for name in ("node_id", "model", "backend", "trainable", "method", "collaboration",
                     "relay", "resumed_from", "tokenizer_fp", "model_fp"):
            if name in start:
                table.add_row(Text(name, style="bold"), Text(fmt.text(start[name], 80)), key=name)
        for name, value in flatten(config):
            if name not in table.rows:
                table.add_row(Text(name), Text(fmt.text(value, 80)), key=name)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        # arrows and page keys should scroll the table / log of a tab as soon as it shows
        self.call_after_refresh(self.refresh_all)   # its panels were skipped while hidden
        targets = event.pane.query("DataTable, Log") if event.pane else []
        if targets:
            targets.first().focus()
        else:
            self.query_one(TabbedContent).query_one("Tabs").focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, PeersTable):
            self._show_peer_detail(event.data_table)

    def _show_peer_detail(self, table: PeersTable) -> None:
        node = None
        if table.row_count:
            node = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        self.query_one("#peer-detail", Packed).show(peer_detail(node, self.state.peers.get(node)))

    # ---- keys ----------------------------------------------------------------------------
    def _node_running(self) -> bool:
        if self.node_process is not None:
            return self.node_process.poll() is None
        return not self.state.finished

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "detach":
            return self.node_process is None    # leaving would orphan the node we started
        return True

    def action_stop(self) -> None:
        """First q: ask the node to stop after this round. Second q, or nothing to stop: leave."""
        if not self._node_running() or self.stop_pressed:
            code = self.node_exit if self.node_exit is not None else 0
            self.exit(code, return_code=code)
            return
        try:
            self.control = write_control(self.run_dir, stop=True)
        except OSError as exc:
            self.notify(f"cannot write {self.run_dir / 'control.json'}: {exc}", severity="error")
            return
        self.stop_pressed = True
        self.notify("stopping after this round… (q again to leave now)")
        self.refresh_all()

    def action_toggle_pause(self) -> None:
        if not self._node_running():
            self.notify("the run has finished: nothing to pause", severity="warning")
            return
        try:
            self.control = write_control(self.run_dir, pause=not self.control["pause"])
        except OSError as exc:
            self.notify(f"cannot write {self.run_dir / 'control.json'}: {exc}", severity="error")
            return
        self.notify("paused: the node waits before its next round" if self.control["pause"]
                    else "resumed")
        self.refresh_all()

    def action_detach(self) -> None:
        self.exit(0)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_next_tab(self, step: int) -> None:
        ids = [tab for tab, _ in TABS]
        tabs = self.query_one(TabbedContent)
        tabs.active = ids[(ids.index(tabs.active) + step) % len(ids)]


def relay_unreachable(record: dict) -> str | None:
    """The relay client's health as the node records it each round: ``relay/state``
    ("connected" | "unreachable" | "refused") and ``relay/reason``.
    Returns e.g. "unreachable (connection refused)" when the relay is not connected, else None."""
    state = record.get("relay/state")
    if not isinstance(state, str) or state == "connected":
        return None
    reason = record.get("relay/reason")
    return f"{state} ({reason})" if isinstance(reason, str) and reason else state


def run_dashboard(run_dir: str | os.PathLike, node_process: subprocess.Popen | None = None,
                  *, poll_interval: float = 0.5, node_stderr: tuple[Path, int] | None = None) -> int:
    """Show the dashboard until the user leaves; returns the node's exit code when it ended,
    else 0. A node process still running on return (the user pressed q twice) is the
    caller's: it has been asked to stop after its round."""
    app = DashboardApp(run_dir, node_process=node_process, poll_interval=poll_interval,
                       node_stderr=node_stderr)
    app.run()
    if node_process is not None and node_process.poll() is not None:
        return node_process.returncode
    return app.return_code or 0
