"""The dashboard's building blocks. Each one watches the app's ``view`` (a ``state.View``,
replaced when the run changed) and redraws itself from it; none reads a file."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.content import Content
from textual.geometry import Size
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from ftis_edge.metrics.compute import saved_phrase
from ftis_edge.tui import format as fmt
from ftis_edge.tui.state import RelayHealth, RunProgress, RunState, View, held_out, phase_text, run_progress

# One colour per role, shared by a plot line and the label that names it (hex for Textual,
# an (r, g, b) tuple for plotext).
OWN, PEERS, ALL = "#4fc3f7", "#ffa726", "#9e9e9e"
GREEN, RED, YELLOW, VIOLET = "#81c784", "#e57373", "#fff176", "#ba68c8"
HELD, HELD_BAND = "#aed581", "#558b2f"      # held-out accuracy and its interval's ends


# What a plot is given at most, either sign: plotext's axis arithmetic overflows near ±1e308
# (a garbled or hostile metrics.jsonl must not take the dashboard down); no real metric is near.
PLOT_LIMIT = 1e12


def _rgb(hex_color: str) -> tuple[int, int, int]:
    h = hex_color.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _thin(xs: list, ys: list, most: int) -> tuple[list, list]:
    """Every k-th point (plus the last): a plot has only so many dots across, and plotext's
    cost grows with the points it is given."""
    if len(xs) <= most:
        return xs, ys
    step = -(-len(xs) // most)
    keep = list(range(0, len(xs), step))
    if keep[-1] != len(xs) - 1:
        keep.append(len(xs) - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def round_ticks(first: int, last: int, most: int = 6) -> list[int]:
    """Whole-round x ticks, at most ``most`` of them, on a 1-2-5 grid (plotext alone would
    label rounds 1.0, 8.2, 15.5 ...)."""
    scale = 1
    while True:
        for step in (scale, 2 * scale, 5 * scale):
            ticks = range(-(-first // step) * step, last + 1, step)
            if len(ticks) <= most:
                return list(ticks) or [first]
        scale *= 10


def line(*parts) -> Content:
    """``Content.assemble``, with each part's leading spaces moved onto the part before.

    SVG renderers such as rsvg drop the leading space of a text run and stretch the rest,
    so screenshots would read "0.650( avg10"; a trailing space is harmless."""
    out: list[list] = []
    for part in parts:
        text, style = (part, "") if isinstance(part, str) else part
        body = text.lstrip(" ")
        if body != text and out and not out[-1][0].endswith("\n"):
            out[-1][0] += text[: len(text) - len(body)]
            text = body
        if text:
            out.append([text, style])
    return Content.assemble(*(tuple(p) for p in out))


BREAK = Content("\n")     # a chunk that ends the line


def field(label: str, value: str) -> Content:
    """One "label value" chunk of a Packed line."""
    return line((label + " ", "dim"), value) if label else Content(value)


def follow_view(widget: Widget, redraw: Callable[[View], None]) -> None:
    """Call ``redraw(view)`` now (when there is one) and whenever the app's view changes."""
    def changed(view: View | None) -> None:
        if view is not None:
            redraw(view)
    widget.watch(widget.app, "view", changed, init=True)


class Packed(Widget):
    """Chunks laid out left to right that wrap only *between* chunks, so a narrow terminal
    never splits "7.1 s" or "peers 0.840" across lines (Textual wraps at any space)."""

    DEFAULT_CSS = "Packed { height: auto; }"
    GAP = "   "

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.chunks: list[Content] = []

    def show(self, chunks: list[Content]) -> None:
        if [c.markup for c in chunks] != [c.markup for c in self.chunks]:
            self.chunks = chunks
            self.refresh(layout=True)

    @property
    def text(self) -> str:
        """All chunks on one line, as plain text."""
        return self.GAP.join(c.plain for c in self.chunks if c is not BREAK)

    def pack(self, width: int) -> list[Content]:
        lines: list[Content] = []
        current: Content | None = None
        for chunk in self.chunks:
            if chunk is BREAK:
                lines.append(current or Content(""))
                current = None
            elif current is None:
                current = chunk
            elif current.cell_length + len(self.GAP) + chunk.cell_length <= width:
                current = current + self.GAP + chunk
            else:
                lines.append(current)
                current = chunk
        if current is not None:
            lines.append(current)
        return lines or [Content("")]

    def render(self) -> Content:
        return Content("\n").join(self.pack(self.content_region.width or 80))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.pack(width))


class ViewLine(Packed):
    """A Packed line that follows the view: ``chunks(view)`` says what it shows."""

    def __init__(self, chunks: Callable[[View], list[Content]], *, id: str | None = None,
                 classes: str | None = None, hide_empty: bool = False) -> None:
        super().__init__(id=id, classes=classes)
        self.chunks_of = chunks
        self.hide_empty = hide_empty          # no chunks: take no room at all

    def on_mount(self) -> None:
        follow_view(self, self._redraw)

    def _redraw(self, view: View) -> None:
        chunks = self.chunks_of(view)
        if self.hide_empty:
            self.display = bool(chunks)
        self.show(chunks)


class Legend(Static):
    """One dim line under a tab's title: what its numbers count."""

    DEFAULT_CSS = "Legend { height: auto; padding: 0 1; color: $text-muted; }"


@dataclass(frozen=True)
class Series:
    """One metric of a panel: its key in metrics.jsonl, how it is labelled and drawn."""
    key: str
    label: str
    color: str
    render: Callable[[object], str] = fmt.num
    mean: bool = False           # also show the mean of the last 10 rounds
    plot: bool = True            # False: a number in the stats line only
    points: Callable[[RunState], tuple[list, list]] | None = None   # (rounds, values) other than key's
    value: Callable[[RunState], float | None] | None = None          # the stats line's value other than key's
    marker: str = "braille"      # plotext marker: lines of one panel told apart by style, not colour alone
    trend: bool = False          # also draw the mean of the last TREND rounds (noisy rounds: where it heads)


TREND = 5


def trend_line(ys: list[float], window: int = TREND) -> list[float]:
    """The running mean of the last ``window`` values (fewer at the start): a round's noise
    (groups of 4-8 answers) hides where reward heads; the mean over rounds shows it."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y - (ys[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def records_key(state: RunState) -> tuple:
    """Changes when the rounds do (a new record, or a resume that replaced some)."""
    return len(state.rounds), id(state.rounds[-1]) if state.rounds else None


class MetricPanel(Vertical):
    """A bordered panel: a line of latest values (coloured like the plot lines) over a plot."""

    def __init__(self, title: str, series: list[Series], *, ylim: tuple[float, float] | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.panel_title = title
        self.series = series
        self.ylim = ylim

    def compose(self) -> ComposeResult:
        yield Packed(classes="stats")
        yield PlotextPlot(classes="plot")

    def on_mount(self) -> None:
        self.border_title = self.panel_title
        plt = self.query_one(PlotextPlot).plt
        plt.xlabel("round")
        self._state: RunState | None = None
        self._drawn: tuple | None = None       # (records, width) the plot shows
        follow_view(self, self._view_changed)

    def _view_changed(self, view: View) -> None:
        # a view that only moved the round clock leaves the numbers and the plot as they are
        if self._state is view.state and self._drawn is not None and self._drawn[0] == records_key(view.state):
            return
        self._state = view.state
        # plots in hidden tabs are drawn when they show (on_show)
        self.update_from(view.state, plot=bool(self.region.width))

    def on_show(self) -> None:
        self.call_after_refresh(self._catch_up)

    def on_resize(self) -> None:
        self.call_after_refresh(self._catch_up)

    def _catch_up(self) -> None:
        if self._state is not None and self.region.width and \
                self._drawn != (records_key(self._state), self.size.width):
            self._replot(self._state)

    def stats(self, state: RunState) -> list[Content]:
        """One chunk per series: its label in the line's colour, the latest value, the mean."""
        chunks = []
        for s in self.series:
            if s.label is None:
                continue
            value = s.value(state) if s.value else state.last(s.key)
            parts = [(s.label + " ", s.color), (s.render(value), "bold")]
            if s.mean:
                parts += [" (", ("avg10 ", "dim"), s.render(state.mean_last(s.key)), ")"]
            chunks.append(line(*parts))
        return chunks

    def update_from(self, state: RunState, *, plot: bool = True) -> None:
        """New numbers always; a new plot only when asked (hidden panels skip the costly part)."""
        self.query_one(".stats", Packed).show(self.stats(state))
        if plot:
            self._replot(state)

    def _replot(self, state: RunState) -> None:
        self._drawn = (records_key(state), self.size.width)
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        dots_across = 2 * max(self.size.width, 40)      # braille: two dots per cell
        # plotext draws a line dot by dot: a point far outside a fixed y range costs one step per
        # dot of the distance (1e12 on a 0-1 axis never ends), so points stay near the range
        low, high = -PLOT_LIMIT, PLOT_LIMIT
        if self.ylim:
            span = self.ylim[1] - self.ylim[0]
            low, high = self.ylim[0] - span, self.ylim[1] + span
        first_x = None
        for s in self.series:
            xs, ys = _thin(*(s.points(state) if s.points else state.series(s.key)), most=dots_across)
            ys = [min(max(y, low), high) for y in ys]
            if s.plot and ys:
                plt.plot(xs, ys, color=_rgb(s.color), marker=s.marker)
                first_x = xs[0] if first_x is None else min(first_x, xs[0])
                if s.trend and len(ys) >= 3:
                    plt.plot(xs, trend_line(ys), color=_rgb(s.color), marker="hd")
        if self.ylim:
            plt.ylim(*self.ylim)
        if state.rounds:
            first, last = state.rounds[0]["round"], state.rounds[-1]["round"]
            if first_x is not None:          # the held-out curve starts at round 0 (the base model)
                first = min(first, first_x)
            plt.xticks(round_ticks(first, last))
            plt.xlim(first, max(last, first + 1))
        plot.refresh()


class Headline(Grid):
    """The strip under the header: the numbers to glance at, one cell each."""

    CELLS = [("round", "round"), ("reward", "reward"), ("accuracy", "accuracy"),
             ("heldout", "held-out"), ("dropped", "KL-dropped"), ("speed", "tok/s"), ("peers", "peers"),
             ("relay", "relay"), ("state", "state")]

    def compose(self) -> ComposeResult:
        for key, _ in self.CELLS:
            yield Static(id=f"hl-{key}", classes="cell")

    def on_mount(self) -> None:
        follow_view(self, self.update_from)

    def show(self, key: str, value: str, style: str = "") -> None:
        label = dict(self.CELLS)[key]
        self.query_one(f"#hl-{key}", Static).update(
            line((label, "dim"), "\n", (value, f"bold {style}".strip())))

    def update_from(self, view: View) -> None:
        state = view.state
        self.show("round", fmt.integer(state.last_round))
        self.show("reward", f"{fmt.num(state.last('reward/own'), 2)}/"
                            f"{fmt.num(state.mean_last('reward/own'), 2)}", OWN)
        self.show("accuracy", fmt.pct(state.last("accuracy/own")))
        ev = held_out(state)
        self.show("heldout", ev.cell, RED if ev.guard_level else HELD)
        self.show("dropped", fmt.pct(state.last("filter/dropped_frac")))
        self.show("speed", fmt.integer(state.last("gen/tok_s")))
        active, quarantined = state.peer_counts()
        peers = (f"{active}" + (f" +{quarantined}q" if quarantined else "")) if state.rounds else fmt.MISSING
        self.show("peers", peers, RED if quarantined else "")
        self.show("relay", view.relay.short, relay_colour(view.relay))
        self.show("state", view.word, view.colour)


def relay_colour(relay: RelayHealth) -> str:
    return {"connected": GREEN, None: "", "off": ""}.get(relay.state, RED)


def relay_chunks(view: View) -> list[Content]:
    """The relay and this round's intake."""
    state, latest = view.state, view.state.latest
    if not latest:
        return [Content.styled("relay and intake: no rounds yet", "dim")]
    address = state.identity("relay")
    return [
        line(("relay ", "dim"), (fmt.text(address) if address else "none", "bold")),
        line((view.relay.sentence, relay_colour(view.relay))),
        field("latency", f"{fmt.num(latest.get('relay/latency_ms'), 1)} ms"),
        field("replayed", f"{fmt.integer(latest.get('relay/replayed'))} since the node started"),  # cumulative
        BREAK,
        field("this round: peer groups received", fmt.integer(latest.get("peers/groups_received"))),
        field("peer samples in the batch", fmt.integer(latest.get("peers/samples_used"))),
        field("refused", fmt.integer(latest.get("peers/rejected"))),
        field("too old", fmt.integer(latest.get("peers/stale"))),
        BREAK,
        line((saved_phrase(latest) or "the swarm supplied nothing yet", "bold")),
        *worth_lines(latest),
        field("skipped: all-equal rewards", fmt.integer(latest.get("peers/skipped_zero_advantage"))),
        field("per-peer cap", fmt.integer(latest.get("peers/skipped_peer_cap"))),
        field("surplus", fmt.integer(latest.get("peers/skipped_surplus"))),
    ]


def worth_lines(latest: dict) -> list[Content]:
    """What each kind of peer is worth to this node, in words (swarm.fill_by_worth; worth.py)."""
    said = latest.get("worth/said")
    if not isinstance(said, list):
        return []
    return [line((fmt.text(s, 160), RED if ": not used" in str(s) else "")) for s in said]


def held_out_chunks(view: View) -> list[Content]:
    """The Overview's held-out line: the newest eval with its interval, base and best, and what
    the swarm guard said last (red while it keeps the node from part of the swarm)."""
    ev = held_out(view.state)
    if ev.accuracy is None:          # eval off, before the base model's eval, or a run from before it
        if ev.base is None:
            return []
        return [line(("held-out ", HELD), (f"base model {fmt.pct(ev.base, 0)}", "bold"),
                     (f" on {fmt.integer(ev.n)} prompts (the trained weights' evals follow)"
                      if ev.n is not None else "", "dim"))] + _too_few(ev)
    lo_hi = f" [{fmt.pct(ev.lo, 0)}–{fmt.pct(ev.hi, 0)}]" if ev.lo is not None and ev.hi is not None else ""
    chunks = [line(("held-out ", HELD), (f"{fmt.pct(ev.accuracy, 0)}{lo_hi}", "bold"),
                   ("" if ev.round is None else f" at round {ev.round}", "dim"))]
    if ev.base is not None:
        chunks.append(field("base", fmt.pct(ev.base, 0)))
    if ev.best is not None and ev.beat_base:
        chunks.append(field("best", f"{fmt.pct(ev.best, 0)} (round {fmt.integer(ev.best_round)}, its weights kept)"))
    elif ev.best is not None:
        chunks.append(line(("no eval beat the base model yet", "bold")))
    chunks += _too_few(ev)
    if ev.guard:        # "evidence: action": one chunk per clause, so a narrow screen wraps between them
        parts = ev.guard.split(": ")
        ends = [":" if i < len(parts) - 1 else "" for i in range(len(parts))]
        chunks += [BREAK, line(("swarm guard: ", "bold " + (RED if ev.guard_level else GREEN)), parts[0] + ends[0])]
        chunks += [Content(p + e) for p, e in zip(parts[1:], ends[1:])]
    return chunks


def _too_few(ev) -> list[Content]:
    from ftis_edge.metrics.best import too_few_words
    return [line((too_few_words(ev.n), f"bold {RED}"))] if ev.too_few else []


BAR = 20      # cells of the round's progress bar


def progress_chunks(view: View) -> list[Content]:
    """The Overview's round line: the phase, a bar for the round, the ETA and round times."""
    state, clock = view.state, view.clock
    if view.progress is not None and view.progress.get("phase") != "stopped" and not state.finished:
        what = phase_text(view.progress, view.now)
    else:
        what = view.sentence
    run = run_progress(state, clock)
    head = "" if clock.round is None else f"round {clock.round}: " if run is None else \
        f"round {clock.round} of {run.total}: "
    chunks = [line((head + what, "bold"))]
    if clock.fraction is not None:
        full = int(round(clock.fraction * BAR))
        chunks.append(line(("█" * full, OWN), ("░" * (BAR - full), "dim"), f" {100 * clock.fraction:.0f}%"))
        chunks.append(field("ETA", fmt.age(clock.eta)))
    if run is not None:         # short when the head already says "of N": two lines at 80 columns
        chunks.append(run_chunk(run, total_shown=clock.round is not None))
    chunks.append(field("last round", fmt.seconds(state.last("time/round_s"))))
    if not state.finished:      # the usual round time predicts the rounds to come: none are left
        chunks.append(field("avg5", fmt.seconds(clock.typical)))
    swarm = saved_phrase(state.latest) if state.latest else None
    if swarm:                       # what joining saved: the swarm's groups stand in for your own
        chunks += [BREAK, line((swarm, "bold"))]
    return chunks


def run_chunk(run: RunProgress, *, total_shown: bool = False) -> Content:
    """The whole run, beside the round's bar: "4 of 30 rounds done (13%) · ~26 min left", or
    "4 done (13%) · ~26 min left" after a "round 5 of 30" head. The percentage is always of
    the rounds done, the count printed beside it."""
    left = f" · {time_left(run.left_s)}" if run.left_s is not None and run.done < run.total else ""
    counter = f"{run.done} done" if total_shown else f"{run.done} of {run.total} rounds done"
    return line((counter, "bold"), f" ({run.percent}%){left}")


def time_left(seconds: float) -> str:
    """A coarse estimate in words: "<1 min left", "~26 min left", "~3.5 h left"."""
    minutes = seconds / 60
    if minutes < 1:
        return "<1 min left"
    if minutes < 120:
        return f"~{math.ceil(minutes)} min left"
    return f"~{minutes / 60:.1f} h left"


class PeersTable(DataTable):
    """One row per peer (cumulative stats from the latest round); quarantined rows in red.
    At most ``MOST`` rows, the most recently seen peers: a table of 10,000 rows costs seconds
    to build and nobody reads it (the caption says how many are left out)."""

    MOST = 200

    COLUMNS = [("node", "node"), ("sent", "sent"), ("accepted", "accepted"),
               ("rejected", "rejected"), ("acceptance_rate", "acc. rate"), ("kl_mean", "KL"),
               ("quarantined", "quarantined"), ("last_seen", "last seen"), ("model", "model"),
               ("tokenizer", "tokenizer")]

    def on_mount(self) -> None:
        self.cursor_type = "row"
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)
        self._shown: tuple | None = None
        follow_view(self, self._view_changed)

    def _view_changed(self, view: View) -> None:
        if self._shown != records_key(view.state):      # peers change with a round record only
            self._shown = records_key(view.state)
            self.update_from(view.state)

    @staticmethod
    def cells(node: str, peer: dict, now: float | None, kl_gate: float | None = None) -> dict[str, Text]:
        seen = fmt.as_number(peer.get("last_seen"))
        seen = seen if seen and seen > 0 else None       # 0: not seen since a resume (never "20789d")
        values = {
            "node": fmt.text(node, 24), "model": fmt.text(peer.get("model"), 28),
            "tokenizer": fmt.text(peer.get("tokenizer"), 16),
            "last_seen": fmt.age(now - seen) if now is not None and seen is not None else fmt.MISSING,
            "sent": fmt.integer(peer.get("sent")), "accepted": fmt.integer(peer.get("accepted")),
            "rejected": fmt.integer(peer.get("rejected")),
            "acceptance_rate": fmt.pct(peer.get("acceptance_rate")),
            "kl_mean": kl_words(peer.get("kl_mean"), kl_gate),
            "quarantined": fmt.yes_no(peer.get("quarantined")),
        }
        quarantined = peer.get("quarantined") is True
        right = {"sent", "accepted", "rejected", "acceptance_rate", "kl_mean", "last_seen"}
        out = {}
        for key, value in values.items():
            # rich Text, not str: DataTable parses str as markup, and a peer picks its own name
            style = RED if quarantined else ""
            if quarantined and key in ("node", "quarantined"):
                style = "bold " + RED
            out[key] = Text(value, style=style, justify="right" if key in right else "left")
        return out

    @classmethod
    def shown(cls, peers: dict[str, dict]) -> list[str]:
        """The peers the table shows: all of them (in the node's order) up to MOST, else the
        MOST most recently seen."""
        if len(peers) <= cls.MOST:
            return list(peers)
        return heapq.nlargest(cls.MOST, peers, key=lambda n: fmt.as_number(peers[n].get("last_seen")) or 0.0)

    def update_from(self, state: RunState) -> None:
        now = state.now()
        shown = self.shown(state.peers)
        keep = set(shown)
        for row_key in list(self.rows):
            if row_key.value not in keep:
                self.remove_row(row_key)
        for node in shown:
            cells = self.cells(node, state.peers[node], now, kl_gate(state))
            if node in self.rows:
                for key, _ in self.COLUMNS:
                    self.update_cell(node, key, cells[key])
            else:
                self.add_row(*(cells[key] for key, _ in self.COLUMNS), key=node)


DEFAULT_KL_GATE = 5.0       # train.kl_threshold's default, for a run whose start record lacks it


def kl_gate(state: RunState) -> float:
    """The run's F- filter gate (train.kl_threshold) from its start record."""
    cfg = (state.start or {}).get("config")
    train = cfg.get("train") if isinstance(cfg, dict) else None      # records come from a file: anything
    gate = fmt.as_number(train.get("kl_threshold")) if isinstance(train, dict) else None
    return gate if gate is not None and gate > 0 else DEFAULT_KL_GATE


def kl_words(kl, gate: float | None) -> str:
    """A peer's mean KL with what it means against the F- gate: "0.02 like ours", "1.3 near",
    "1391 28x the gate" (its below-average samples are dropped by the filter)."""
    value = fmt.as_number(kl)
    if value is None:
        return fmt.MISSING
    gate = gate or DEFAULT_KL_GATE
    shown = fmt.num(value, 2) if value < 100 else fmt.integer(value)
    if value < 0.1:
        return f"{shown} like ours"
    if value < gate:
        return f"{shown} near"
    return f"{shown} {value / gate:.0f}x gate" if value >= 2 * gate else f"{shown} past gate"


def peers_shown(view: View) -> list[Content]:
    """The line over the table: how many peers, and which ones the table leaves out."""
    active, quarantined = view.state.peer_counts()
    total = active + quarantined
    text = f"{total} peers ({quarantined} quarantined)"
    if total > PeersTable.MOST:
        text += f": the {PeersTable.MOST} most recently seen are listed"
    return [Content.styled(text, "dim")]


def peer_detail(node: str | None, peer: dict | None) -> list[Content]:
    """The highlighted peer's rejection reasons and F-TIS stats (not worth a column each)."""
    if not node or not isinstance(peer, dict):
        return [Content.styled("no peers yet", "dim")]
    reasons = peer.get("rejected_by_reason")
    if isinstance(reasons, dict) and reasons:
        why = ", ".join(f"{fmt.text(k, 24)} {fmt.integer(v)}" for k, v in reasons.items())
    else:
        why = "none"
    chunks = [Content.styled(fmt.text(node, 24), "bold"), field("rejected:", why),
              field("timeouts", fmt.integer(peer.get("grader_timeouts"))),
              field("IS w", fmt.num(peer.get("is_weight_mean"))),
              field("filtered", fmt.pct(peer.get("filter_rate")))]
    # why intake stopped trusting it (peers.book.PeerBook), and a model / tokenizer swap mid-run
    if peer.get("quarantined") is True:
        chunks.append(line(("quarantined: ", "bold " + RED), fmt.text(peer.get("quarantine_reason") or "yes", 80)))
    if fmt.as_number(peer.get("fingerprint_changes")):
        chunks.append(field(f"fingerprint changed {fmt.integer(peer.get('fingerprint_changes'))}x:",
                            fmt.text(peer.get("fingerprint_change"), 80)))
    return chunks


HELP = [
    ("q", "stop the node after this round (q again: leave now);"),
    ("", "watching another's node: q leaves, it keeps running"),
    ("p", "pause / resume: the node waits before its next round"),
    ("", "(watching: p asks first, y confirms)"),
    ("S", "watching: stop the node after its round (y confirms)"),
    ("1 … 7", "overview · filter & IS · KL & loss · throughput ·"),
    ("", "peers · config · log"),
    ("[  ]", "previous / next tab"),
    ("?", "this help (escape closes it)"),
    ("ctrl+q", "leave the dashboard at once"),
]


class HelpScreen(ModalScreen[None]):
    """The keys, in a box over the dashboard."""

    BINDINGS = [Binding("escape", "close", "close"), Binding("question_mark", "close", "close"),
                Binding("q", "close", "close", show=False)]

    def compose(self) -> ComposeResult:
        rows = [line((key.ljust(8), "bold"), what) for key, what in HELP]
        with VerticalScroll(id="help-box"):
            yield Static(Content("\n").join(rows), id="help-text")

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "keys"
        self.query_one("#help-box").border_subtitle = "escape to close"

    def action_close(self) -> None:
        self.dismiss(None)
