"""The ftis-edge dashboard: a Textual app that follows a run directory.

It only reads files (metrics.jsonl, progress.json, node.log, config.toml) on a timer and
writes control.json when a key asks it to, so it can never slow the training loop down: the
node runs in its own process and does not know whether anyone is watching.

The timer only reads. What it read becomes a new ``view`` (state.View) when anything the
dashboard shows changed; the widgets watch that reactive and redraw themselves from it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.geometry import Size
from textual.reactive import reactive
from textual.widgets import DataTable, Footer, Header, Log, Static, TabbedContent, TabPane

from ftis_edge.store import progress as phases
from ftis_edge.store.record_watch import RecordWatch
from ftis_edge.metrics.records import LOG_FILE, MetricsFollower, read_control, write_control
from ftis_edge.common.text_safety import shown
from ftis_edge.store.rundir import exit_words, has_traceback, last_error_line, resume_command, stop_words
from ftis_edge.tui import format as fmt
from ftis_edge.tui.state import (
    LogTail,
    RelayHealth,
    RunState,
    View,
    flatten,
    held_out,
    held_out_points,
    load_config,
    phase_text,
    progress_is_current,
    relay_health,
    round_clock,
)
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
    Legend,
    MetricPanel,
    Packed,
    PeersTable,
    Series,
    ViewLine,
    HELD,
    HELD_BAND,
    field,
    held_out_chunks,
    peer_detail,
    peers_shown,
    progress_chunks,
    relay_chunks,
)

TABS = [("tab-overview", "Overview"), ("tab-filter", "Filter & IS"), ("tab-kl", "KL & loss"),
        ("tab-speed", "Throughput"), ("tab-peers", "Peers"), ("tab-config", "Config"),
        ("tab-log", "Log")]
TALL, WIDE = 40, 140         # from this many rows / columns the overview shows more panels
FINISHED = "#90caf9"

# Panel contents, shared by a panel's own tab and its copy on a large overview.
# own, peers, all: three styles (braille, x, dots) and own's 5-round trend (hd)
REWARD = [Series("reward/own", "own", OWN, mean=True, trend=True), Series("reward/peers", "peers", PEERS, marker="x"),
          Series("reward", "all", ALL, marker="•")]
ACCURACY = [Series("accuracy/own", "training", OWN, fmt.pct, mean=True),
            Series("format/own", "format", VIOLET, fmt.pct),
            # greedy answers to held-out prompts (heldout.py), from round 0 (the base model), with the
            # ends of its 95% interval as two dim lines
            Series("eval/accuracy", "held-out", HELD, lambda v: fmt.pct(v, 0), points=held_out_points,
                   value=lambda state: held_out(state).accuracy),
            Series("eval/accuracy_lo", None, HELD_BAND,
                   points=lambda state: held_out_points(state, "eval/accuracy_lo", "eval/base_lo")),
            Series("eval/accuracy_hi", None, HELD_BAND,
                   points=lambda state: held_out_points(state, "eval/accuracy_hi", "eval/base_hi"))]
FILTER = [Series("filter/adv_le0_frac", "advantage ≤ 0", YELLOW, fmt.pct),
          Series("filter/kl_gt_g_frac", "KL > g", VIOLET, fmt.pct),
          Series("filter/dropped_frac", "dropped (both)", RED, fmt.pct)]
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
# One line under each tab's title: what its numbers count.
LEGENDS = {
    "tab-overview": "reward, training: sampled answers to training prompts; held-out: greedy answers to unseen "
                    "prompts, what you take home: the two can disagree",
    "tab-filter": "advantage ≤ 0: samples that scored no better than their group's mean · KL > g: past the "
                  "KL gate · dropped (both): removed from the update by the F- filter · w: importance weight",
    "tab-kl": "KL: learner vs generator per sample (k3) · |ℓ−g|: mean per-token log-prob mismatch · "
              "loss: the F-TIS objective",
    "tab-speed": "tok/s and length of own generation · seconds per round by part · bytes per token on the wire",
    "tab-peers": "this round: what arrived from peers and how much of it trained; the table: per peer, "
                 "counts since the node started (rollouts sent / accepted / refused) · KL: how far the peer's "
                 "samples are from what our model would write (mean k3 KL per token, in nats; ~0 like ours, "
                 "another model is far); past the gate (train.kl_threshold) its below-average samples are "
                 "dropped by the F- filter",
    "tab-config": "the node's resolved settings; bold rows: its identity from the start record",
    "tab-log": "node.log as the node writes it (newest at the bottom)",
}
SHORT_PHASE = {phases.WAITING: "peer wait", phases.CHECKPOINTING: "checkpoint"}

TIMES = [Series("time/train_s", "train", PEERS, fmt.seconds, mean=True),
         Series("time/gen_s", "gen", OWN, fmt.seconds), Series("time/round_s", "round", ALL, fmt.seconds)]


CONFIRM_S = 5.0        # how long S waits for its y


class DashboardApp(App[int]):
    """Follows RUN_DIR live; ``node_process`` is the node's Popen when we started it."""

    CSS_PATH = "dashboard.tcss"
    TITLE = "ftis-edge"
    # Two sets of keys, one shown at a time (check_action): our own node's (q stops it, p pauses
    # it) and a watcher's (q leaves; stopping or pausing someone's node takes a confirmed key).
    BINDINGS = [
        Binding("q", "stop", "stop"),
        Binding("q", "leave", "leave"),
        # Ctrl-C means what it means headless: stop after the round; twice: abort (checkpoint kept)
        Binding("ctrl+c", "interrupt", "stop", show=False, priority=True),
        Binding("p", "toggle_pause", "pause"),
        Binding("p", "ask_pause", "pause…"),
        Binding("d", "detach", "detach", show=False),
        # watching someone's node: stopping it takes two deliberate keys (S, then y), never q
        Binding("S", "ask_stop", "stop…"),
        Binding("y", "confirm_stop", "confirm", show=False),
        Binding("question_mark", "help", "help"),
        Binding("left_square_bracket", "next_tab(-1)", "previous tab", show=False),
        Binding("right_square_bracket", "next_tab(1)", "next tab", show=False),
        *[Binding(str(i), f"show_tab('{tab}')", label, show=False)
          for i, (tab, label) in enumerate(TABS, start=1)],
    ]

    view: reactive[View | None] = reactive(None, init=False, always_update=True)

    def __init__(self, run_dir: str | os.PathLike, node_process: subprocess.Popen | None = None,
                 *, poll_interval: float = 0.5, node_stderr: tuple[Path, int] | None = None,
                 notes: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__()
        self.opened_at = time.time()
        self.notes = list(notes)               # what the caller wants on screen (e.g. the demo's left-out nodes)
        self.run_dir = Path(run_dir)
        self.node_process = node_process
        self.node_stderr = node_stderr         # (file, offset) where the node's one-line error lands
        self.failure: str | None = None        # that line, once the node has failed
        self._relay_problem: str | None = None
        self._diverging: str | None = None
        self.poll_interval = poll_interval
        self.state = RunState()
        self.follower = MetricsFollower(self.run_dir)
        self.log_tail = LogTail(self.run_dir / LOG_FILE)
        self.control = read_control(self.run_dir)
        self.node_exit: int | None = None     # the node process's exit code once it has ended
        self.stop_pressed = False
        self.left_running = False              # q q: the node finishes its round in the background
        self.previous_stop: dict | None = None  # the stop record of the run this node resumes
        self.progress: dict | None = None
        self._view_key: tuple | None = None
        self._config_key: tuple | None = None
        self.record_watch = RecordWatch(self.run_dir)   # RUN/config.toml edited while the node runs

    # ---- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Headline(id="headline")
        with TabbedContent(initial="tab-overview"):
            with TabPane("Overview", id="tab-overview"):
                yield Legend(LEGENDS["tab-overview"])
                yield Static("\n".join(self.notes), id="notes", classes="" if self.notes else "hidden")
                yield Static(id="diverging", classes="hidden")     # the node's own training collapsing
                yield ViewLine(progress_chunks, id="round-progress")
                yield ViewLine(held_out_chunks, id="held-out", hide_empty=True)
                with Horizontal(classes="row"):
                    yield MetricPanel("reward", REWARD, ylim=(0, 1), id="panel-reward")
                    yield MetricPanel("accuracy", ACCURACY, ylim=(0, 1), id="panel-accuracy")
                    yield MetricPanel("loss", LOSS, id="ov-loss", classes="wide-only")
                with Horizontal(classes="row tall-only"):
                    yield MetricPanel("filter rates", FILTER, ylim=(0, 1), id="ov-filter")
                    yield MetricPanel("importance weights", IS, id="ov-is")
                    yield MetricPanel("KL · log-prob mismatch", KL, id="ov-kl", classes="wide-only")
            with TabPane("Filter & IS", id="tab-filter"):
                yield Legend(LEGENDS["tab-filter"])
                with Horizontal(classes="row"):
                    yield MetricPanel("filter rates", FILTER, ylim=(0, 1), id="panel-filter")
                    yield MetricPanel("importance weights", IS, id="panel-is")
            with TabPane("KL & loss", id="tab-kl"):
                yield Legend(LEGENDS["tab-kl"])
                with Horizontal(classes="row"):
                    yield MetricPanel("KL · log-prob mismatch", KL, id="panel-kl")
                    yield MetricPanel("loss", LOSS, id="panel-loss")
            with TabPane("Throughput", id="tab-speed"):
                with Vertical():
                    yield Legend(LEGENDS["tab-speed"])
                    with Horizontal(classes="row"):
                        yield MetricPanel("generation", TOKS, id="panel-toks")
                        yield MetricPanel("time per round", TIMES, id="panel-time")
                    yield ViewLine(wire_chunks, id="speed-wire")
            with TabPane("Peers", id="tab-peers"):
                with Vertical():
                    yield Legend(LEGENDS["tab-peers"])
                    yield ViewLine(relay_chunks, id="relay-status")
                    yield ViewLine(peers_shown, id="peers-shown")
                    yield PeersTable(id="peers-table")
                    yield Packed(id="peer-detail")
            with TabPane("Config", id="tab-config"):
                with Vertical():
                    yield Legend(LEGENDS["tab-config"])
                    yield Static(id="config-source")
                    yield DataTable(id="config-table", cursor_type="row")
            with TabPane("Log", id="tab-log"):
                yield Legend(LEGENDS["tab-log"])
                yield Log(id="log", max_lines=5000)
        yield Footer()

    def on_mount(self) -> None:
        self.main_screen = self.screen
        table = self.query_one("#config-table", DataTable)
        table.add_column("key", key="key")
        table.add_column("value", key="value")
        self._apply_size(self.size)
        for note in self.notes:
            self.query_one("#log", Log).write_line(note)
            self.notify(note, severity="warning", timeout=30)
        self.poll()                            # draw what is already there before the first tick
        self.set_interval(self.poll_interval, self.poll)

    def on_resize(self, event) -> None:
        self._apply_size(event.size)           # panels that appear draw themselves (on_show)

    def _apply_size(self, size: Size) -> None:
        screen = getattr(self, "main_screen", self.screen)
        screen.set_class(size.height >= TALL, "-tall")
        screen.set_class(size.width >= WIDE, "-wide")

    # ---- following the run ---------------------------------------------------------------
    def poll(self) -> None:
        """Read what the node appended since the last tick; a new view when anything shown changed."""
        changed = self.state.ingest(self.follower.poll())
        self._forget_previous_stop()
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
                self._forget_previous_stop()
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
        progress = phases.read_progress(self.run_dir)
        self.progress = progress if progress_is_current(progress, self.state) else None
        self.publish(changed)
        self._refresh_config()
        self._say_record_edits()

    def _say_record_edits(self) -> None:
        """An edit of RUN/config.toml while the node runs applies only on resume: said at once
        (a toast and the Log tab), not left for the user to find out."""
        news = self.record_watch.news()
        if news and self._node_running():
            self.notify(shown(news, markup=True), title="config.toml changed", severity="warning", timeout=20)
            self.query_one("#log", Log).write_line(news)

    def _forget_previous_stop(self) -> None:
        """The node we started resumes a run: the stop record it finds is the previous run's
        (written before we opened), not news that it finished."""
        stop = self.state.stop
        if self.node_process is not None and stop is not None:
            written = fmt.as_number(stop.get("time"))
            if written is not None and written < self.opened_at:
                self.previous_stop, self.state.stop = stop, None

    def publish(self, changed: bool = True) -> None:
        """Hand the widgets a new view when what they show changed (or the round clock ticked)."""
        now = time.time()
        clock = round_clock(self.state, self.progress, now)
        ticking = self.progress is not None and (clock.elapsed is not None or
                                                 self.progress.get("phase") in (phases.LOADING, phases.WAITING))
        key = (repr(self.progress), self.control, self.node_exit, self.failure, self.stop_pressed,
               int(now) if ticking else None)
        if not changed and key == self._view_key and self.view is not None:
            return
        self._view_key = key
        relay = relay_health(self.state, self.progress)   # the one reading: header, headline, Peers tab
        word, colour, sentence = self.status(relay)
        self.view = View(self.state, word, colour, sentence, relay, self.progress, clock, now)

    def watch_view(self, view: View | None) -> None:
        main = getattr(self, "main_screen", None)       # the help box may be on top of it
        tables = main.query(PeersTable) if main is not None else []
        if view is None or not tables or not main.query("#diverging") or not main.query("#log"):
            return             # a tick while the app opens or closes: its widgets come and go one by one
        st = view.state
        node, model = st.identity("node_id"), st.identity("model")
        self.title = "ftis-edge" + (f" · {fmt.text(node, 32)}" if node else "")
        # the state first: a narrow header cuts the end of the line
        self.sub_title = view.sentence + (f" · {fmt.text(model, 40)} {fmt.text(st.identity('trainable'))}"
                                          if model else "")
        # a relay that turns unreachable is said once in the Log tab
        problem = view.relay.problem
        if problem != self._relay_problem:
            self._relay_problem = problem
            if problem:
                main.query_one("#log", Log).write_line(f"relay {problem}")
        self._show_diverging(main, st.latest.get("train/diverging"))
        self.call_after_refresh(self._show_peer_detail, tables.first())

    def _show_diverging(self, main, message) -> None:
        """The node's own training collapsing (divergence.py): a red line on the Overview while it
        lasts, a toast when it starts; node.log (the Log tab) has it from the node itself."""
        box = main.query_one("#diverging", Static)
        box.set_class(not message, "hidden")
        if message and message != self._diverging:
            box.update(Text(message, style=f"bold {RED}"))
            if not self._diverging:
                self.notify(message, title="training is diverging", severity="error", timeout=60)
        self._diverging = message or None

    def _show_failure(self, code: int | None) -> None:
        """The node failed: its one-line reason on screen (toast, header, Log tab); the
        traceback is in node.log, which the Log tab follows."""
        line = (self.state.stop or {}).get("error")
        if not line and self.node_stderr is not None:
            line = last_error_line(*self.node_stderr)
        # killed (kill -9, out of memory) it printed no error: its exit code says what happened
        # (its stderr's last line may be a note, "note: resuming with ...", which is no reason)
        self.failure = fmt.text(line, 300) if line else (exit_words(code) or "the node stopped without a word")
        where = " (traceback: Log tab / node.log)" if has_traceback(self.run_dir) else " (Log tab: node.log)"
        resume = resume_command(self.run_dir)
        title = "node killed" if line is None and code is not None and code < 0 else "node failed"
        self.notify(shown(self.failure + where + (f"; resume: {resume}" if resume else ""), markup=True), title=title,
                    severity="error", timeout=30)
        self.query_one("#log", Log).write_line(f"{title}: {self.failure}")
        self.publish()

    def status(self, relay: RelayHealth) -> tuple[str, str, str]:
        """(short word, colour, sentence) for the headline and the header."""
        st = self.state
        if self.failure is not None:
            if self.node_exit is not None and self.node_exit < 0:
                return "killed", RED, f"node {self.failure}"
            word = "failed" if self.node_exit is None else f"exited {self.node_exit}"
            return word, RED, f"failed: {self.failure}"
        # a node loading after the stop record resumes the run: that stop is the previous run's
        if st.finished and (self.progress or {}).get("phase") != phases.LOADING:
            # the round is on the line already (the headline's cell, the progress line's "round N:")
            return "finished", FINISHED, f"finished ({fmt.text(stop_words(st.stop.get('reason'), short=True))})"
        if self.node_exit is not None:
            colour = RED if self.node_exit else ""
            return f"exited {self.node_exit}", colour, f"node exited with code {self.node_exit}"
        progress = self.progress or {}
        phase = progress.get("phase")
        now = time.time()
        if self.control["stop"]:
            if self.left_running:
                return "stopping…", YELLOW, "finishing this round in the background…"
            return "stopping…", YELLOW, "stopping after this round…"
        if self.control["pause"]:
            return "paused", YELLOW, "paused: p to resume"
        if phase == phases.LOADING:
            return "loading…", YELLOW, phase_text(progress, now)
        resumed_not_started = self.previous_stop is not None and \
            (fmt.as_number((st.start or {}).get("time")) or 0) < self.opened_at
        if resumed_not_started:
            return "starting…", YELLOW, "starting: the node resumes the run after round " + \
                fmt.integer(self.previous_stop.get("round"))
        if st.start is None and not st.rounds:
            return "waiting…", "", "waiting for metrics…"
        doing = phase_text(progress, now) if phase and phase != phases.STOPPED else None
        word = SHORT_PHASE.get(phase, phase) if doing else "running"
        sentence = "running" + (f" · {doing}" if doing else "")
        if st.latest.get("train/diverging"):
            return "diverging", RED, f"{sentence} · training is diverging (Overview)"
        relay_problem = relay.problem
        if relay_problem:
            return word, YELLOW, f"{sentence} · relay {relay_problem}"
        return word, GREEN, sentence


    def _refresh_config(self) -> None:
        config, source = load_config(self.run_dir, self.state.start)
        key = (id(self.state.start), source, repr(config) if source != "start record" else "")
        if key == self._config_key:
            return
        self._config_key = key
        self.query_one("#config-source", Static).update(Text(f"config from {fmt.text(source, 200)}"))  # a path: no markup
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
        targets = event.pane.query("DataTable, Log") if event.pane else []
        if targets:
            targets.first().focus()
        else:
            self.query_one(TabbedContent).query_one("Tabs").focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, PeersTable):
            self._show_peer_detail(event.data_table)

    def _show_peer_detail(self, table: PeersTable) -> None:
        if not table.is_attached:
            return
        node = None
        if table.row_count:
            node = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        table.screen.query_one("#peer-detail", Packed).show(peer_detail(node, self.state.peers.get(node)))

    # ---- keys ----------------------------------------------------------------------------
    def _node_running(self) -> bool:
        if self.node_process is not None:
            return self.node_process.poll() is None
        return not self.state.finished

    OWN_KEYS = ("stop", "toggle_pause")                   # our node: one key acts
    WATCH_KEYS = ("leave", "detach", "ask_pause", "ask_stop")   # someone's node: only asked

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        watching = self.node_process is None    # leaving our own node would orphan it
        if action in self.OWN_KEYS:
            return not watching
        if action in self.WATCH_KEYS:
            return watching
        return True

    def action_leave(self) -> None:
        """Watching: q leaves; the node runs on (S then y stops it, p then y pauses it)."""
        self.exit(0, return_code=0)

    def action_stop(self) -> None:
        """First q: ask the node to stop after this round. Second q: leave now; the node
        finishes its round in the background (``background_notice`` says where to watch it).
        Nothing to stop: leave. Watching (``ftis-edge watch``, the node is not ours): q leaves and
        the node keeps running; S then y stops it."""
        if self.node_process is None and self._node_running() and not self.stop_pressed:
            self.exit(0, return_code=0)
            return
        self._request_stop()

    def action_ask_stop(self) -> None:
        if self.node_process is not None or not self._node_running() or self.stop_pressed:
            return
        self._asked = ("stop", time.monotonic())
        self.notify("stop this node for everyone using it? y: stop it after its round (any other key: no)",
                    severity="warning", timeout=CONFIRM_S)

    def action_ask_pause(self) -> None:
        """Watching: p asks first; a watcher changes nothing without a confirmed key."""
        if not self._node_running():
            self.notify("the run has finished: nothing to pause", severity="warning")
            return
        self._asked = ("pause", time.monotonic())
        question = ("resume this node for everyone using it? y: it starts its next round" if self.control["pause"]
                    else "pause this node for everyone using it? y: it waits before its next round")
        self.notify(f"{question} (any other key: no)", severity="warning", timeout=CONFIRM_S)

    def on_key(self, event) -> None:
        if event.key not in ("y", "S", "p"):       # S or p asked; any other key answers no
            self._asked = None

    def action_confirm_stop(self) -> None:
        """y: the question S or p asked (within CONFIRM_S), answered yes."""
        what, at = getattr(self, "_asked", None) or (None, 0.0)
        self._asked = None
        if what is None or time.monotonic() - at >= CONFIRM_S:
            return
        if what == "stop":
            self._request_stop()
        else:
            self.action_toggle_pause()

    def _request_stop(self) -> None:
        if not self._node_running() or self.stop_pressed:
            self.left_running = self.stop_pressed and self._node_running()
            code = self.node_exit if self.node_exit is not None else 0
            self.exit(code, return_code=code)
            return
        try:
            self.control = write_control(self.run_dir, stop=True)
        except OSError as exc:
            self.notify(f"cannot write {self.run_dir / 'control.json'}: {exc}", severity="error")
            return
        self.stop_pressed = True
        self.notify("stopping after this round, then a checkpoint… (q again: leave now; the node "
                    "then finishes the round in the background)")
        self.publish()

    def action_interrupt(self) -> None:
        """Ctrl-C: the first asks the node to stop after its round (as q); the second aborts it now
        (as a headless node's second Ctrl-C: the round in progress is lost, the last checkpoint
        kept) and leaves once it has ended."""
        if not self._node_running() or (self.node_process is None and not self.stop_pressed):
            self.exit(self.node_exit or 0, return_code=self.node_exit or 0)     # watching: leave, never stop
            return
        if not self.stop_pressed:
            self.action_stop()
            self.notify("Ctrl-C again: abort now (the round in progress is lost, the last checkpoint kept)")
            return
        if self.node_process is not None:
            import signal
            # a SIGINT after a stop was asked (control.json) is the node's "abort now"
            self.node_process.send_signal(signal.SIGINT)
            self.notify("aborting the node…", severity="warning")
        else:
            self.exit(0)

    def background_notice(self) -> str | None:
        """What to tell the terminal when we left a node finishing its round (q q), else None."""
        if not self.left_running:
            return None
        pid = f" (pid {self.node_process.pid})" if self.node_process is not None else ""
        rnd = fmt.integer((self.progress or {}).get("round") or (self.state.last_round or 0) + 1)
        return (f"the node{pid} is still finishing round {rnd} in the background; it then writes a "
                f"checkpoint and stops. Watch it: ftis-edge watch {self.run_dir} "
                f"(log: {self.run_dir / LOG_FILE})")

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
        self.publish()

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


def wire_chunks(view: View) -> list[Content]:
    """The Throughput tab's line under its plots."""
    latest = view.state.latest
    return [field("wire out", f"{fmt.num(latest.get('wire/bytes_per_token_out'), 2)} B/tok"),
            field("in", f"{fmt.num(latest.get('wire/bytes_per_token_in'), 2)} B/tok"),
            field("tokens", fmt.integer(latest.get("gen/tokens"))),
            field("sync", fmt.seconds(latest.get("time/sync_s"))),
            field("peer wait", fmt.seconds(latest.get("time/peer_wait_s"))),
            field("micro-batch", fmt.integer(latest.get("micro_batch"))),
            field("CPU this round", fmt.seconds(latest.get("cpu/round_s"))),
            field("own tokens so far", fmt.integer(latest.get("gen/tokens_total"))),                  # cumulative
            field("CPU so far", fmt.seconds(latest.get("cpu/total_s"))),                              # cumulative
            field("OOM retries", f"{fmt.integer(latest.get('memory/oom_retries'))} total")]  # cumulative


def run_dashboard(run_dir: str | os.PathLike, node_process: subprocess.Popen | None = None,
                  *, poll_interval: float = 0.5, node_stderr: tuple[Path, int] | None = None,
                  notes: list[str] | tuple[str, ...] = ()) -> int:
    """Show the dashboard until the user leaves; returns the node's exit code when it ended,
    else 0. A node process still running on return (the user pressed q twice) is the
    caller's: it has been asked to stop after its round, and the terminal was told so."""
    app = DashboardApp(run_dir, node_process=node_process, poll_interval=poll_interval,
                       node_stderr=node_stderr, notes=notes)
    app.run()
    notice = app.background_notice()
    if node_process is not None and node_process.poll() is None:
        # left running (q q, or ctrl+q): say where it is and how to stop it
        print(notice or (f"the node (pid {node_process.pid}) is still running. Watch it: ftis-edge watch {run_dir}; "
                         f"stop it after its round with: kill -INT {node_process.pid}"), file=sys.stderr)
    if node_process is not None and node_process.poll() is not None:
        code = node_process.returncode
        return 128 - code if code < 0 else code       # killed by signal N: 128+N, as a shell says it
    return app.return_code or 0
