"""Every message true (issue 63) and strings from disk printed inert (issue 62 item 5): each test
drives the real command — the CLI in a subprocess, a real node, a real read-only file system,
the dashboard under Textual's pilot — and asserts the exact words a user now reads."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ftis_edge import config
from ftis_edge.metrics.records import read_control
from ftis_edge.store import checkpoint, rundir
from ftis_edge.tui import DashboardApp
from dashboard import FAST, live_copy, screen_text
from dashboard import wait_for as settle
from procs import ROOT, cli, wait_for

ESC = "\x1b"
# A folder name an attacker would choose: a Rich hyperlink, an OSC 52 clipboard write, a screen clear.
# (a folder name holds no "/": the link is a mailto:, left open to the end of the line)
EVIL = "m[link=mailto:me@evil.example]click\x1b]52;c;ZXZpbA==\x07\x1b[2J"
EVIL_SHOWN = "m[link=mailto:me@evil.example]click\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J"   # as printed


def records(run: Path, *recs: dict) -> None:
    import orjson
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "metrics.jsonl", "ab") as fh:
        for r in recs:
            fh.write(orjson.dumps(r) + b"\n")


def a_run(run: Path, *, rounds: int = 2, checkpoint_round: int | None = None, spec: str = "smollm2-135m") -> Path:
    """A run directory as a node leaves it: its record (config.toml), a start record, rounds, a
    verified checkpoint (checkpoint.save: the real writer) when ``checkpoint_round`` is given."""
    cfg = config.from_dict({"node": {"id": "n", "run_dir": str(run), "rounds": rounds}, "model": {"spec": spec}})
    run.mkdir(parents=True, exist_ok=True)
    rundir.write_record(run, cfg)
    # control characters as TOML escapes (\u001b), as someone crafting the file would write them
    text = (run / "config.toml").read_text()
    (run / "config.toml").write_text("".join(f"\\u{ord(c):04x}" if ord(c) < 32 and c != "\n" else c for c in text))
    records(run, {"type": "start", "time": time.time(), "config": cfg.to_dict()},
            *({"type": "round", "round": r} for r in range(1, (checkpoint_round or 0) + 1)))
    if checkpoint_round is not None:
        checkpoint.save(run, checkpoint_round, {"round": checkpoint_round})
    return run


@contextmanager
def read_only(folder: Path, fill=None):
    """``folder`` on a real read-only file system (a tmpfs mounted ro; ``fill`` writes it first)."""
    folder.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (the read-only file system the test uses)")
    try:
        if fill:
            fill(folder)
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


# ---- item 2: a read-only run directory ------------------------------------------------------------
def test_a_new_run_on_a_read_only_file_system_is_one_line_with_the_fix(tmp_path):
    with read_only(tmp_path / "ro") as ro:
        for run in (ro, ro / "new"):         # the folder itself, a folder to create in it
            r = cli("start", "--headless", "--run-dir", str(run))
            assert r.returncode == 2, r.stderr
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert r.stderr.strip() == (
                f"ftis-edge: error: cannot write the run directory {run} (Read-only file system): a node keeps its "
                f"checkpoints and metrics there; give it a writable folder with --run-dir DIR (a read-only run can "
                f"still be watched, evaluated with eval --model RUN_DIR, and exported with export RUN_DIR --to DIR)")


def test_export_of_a_read_only_run_says_to_use_to(tmp_path):
    with read_only(tmp_path / "ro", fill=lambda f: a_run(f / "run", checkpoint_round=2)) as ro:
        r = cli("export", str(ro / "run"), "--eval-limit", "0")
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines()[-1] == (
            f"ftis-edge export: error: cannot write the export to {ro / 'run' / 'export'} (Read-only file system); "
            f"export it elsewhere with --to DIR")
        assert "OSError" not in r.stderr and "Traceback" not in r.stderr


# ---- item 3: advice that works --------------------------------------------------------------------
def test_a_run_without_a_checkpoint_is_sent_to_resume_or_fresh_and_one_with_to_resume(tmp_path):
    run = a_run(tmp_path / "run")                # stopped during the base eval: no checkpoint
    r = cli("start", "--headless", "--run-dir", str(run))
    program = "python -m ftis_edge.cli"
    assert r.returncode == 2 and r.stderr.strip() == (
        f"ftis-edge: error: {run} already holds a run: it stopped before its first checkpoint, so there is "
        f"nothing to resume: {program} start --run-dir {run} --resume-or-fresh starts it over; --run-dir DIR (or "
        f"another config file name) starts a new one beside it; --overwrite DELETES that run and starts over")
    # the old advice, --resume, is the one that fails here
    assert cli("start", "--headless", "--run-dir", str(run), "--resume").returncode == 2
    checkpoint.save(run, 1, {"round": 1})
    r = cli("start", "--headless", "--run-dir", str(run))
    assert f"already holds a run: {program} start --run-dir {run} --resume continues it;" in r.stderr


def test_the_disk_full_message_gives_the_command_that_works_with_or_without_a_checkpoint(tmp_path):
    from ftis_edge.store import diskspace
    with pytest.raises(diskspace.DiskFull) as e:
        diskspace.require(tmp_path, 1 << 60, "the first checkpoint")
    assert str(e.value).endswith("then start again with --resume-or-fresh (it resumes from the newest checkpoint, "
                                 "or starts fresh when there is none)")
    assert "--resume " not in str(e.value) + " "


# ---- item 4: --resume of a finished run -----------------------------------------------------------
def test_resume_of_a_finished_run_says_so_before_loading_and_how_to_extend_it(tmp_path):
    run = a_run(tmp_path / "run", rounds=2, checkpoint_round=2)
    records(run, {"type": "stop", "round": 2, "reason": "steps", "time": time.time()})
    t0 = time.monotonic()
    r = cli("start", "--headless", "--run-dir", str(run), "--resume")
    program = "python -m ftis_edge.cli"
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"{run} is complete: all 2 rounds are done (its newest checkpoint is round 2); nothing was loaded. To train "
        f"further, ask for more rounds: {program} start --run-dir {run} --resume --rounds 4 (or set node.rounds in "
        f"{run / 'config.toml'}); to use it: {program} export {run}")
    assert time.monotonic() - t0 < 60 and not (run / "node.log").exists()    # no model, no relay, no log
    assert not any(ln.startswith("resume:") for ln in r.stderr.splitlines())   # no "continue with the same" advice


# ---- item 1: a killed node is said to be killed ---------------------------------------------------
def test_exit_words_name_the_signal():
    assert rundir.exit_words(-9) == "killed by SIGKILL (kill -9, or the system ran out of memory)"
    assert rundir.exit_words(-15) == "killed by SIGTERM" and rundir.exit_words(3) == "exited with code 3"
    assert rundir.exit_words(0) is None


def test_a_note_on_stderr_is_never_the_failure(tmp_path):
    path = tmp_path / "node.stderr"
    path.write_text("note: resuming with the run's settings, x/config.toml (edit it ...)\n")
    assert rundir.last_error_line(path) is None
    path.write_text("Traceback (most recent call last):\n  File \"x\", line 1\nValueError: boom\n")
    assert rundir.last_error_line(path) == "ValueError: boom"


@pytest.mark.model
@pytest.mark.slow
async def test_kill_9_of_a_resumed_node_is_reported_as_killed_not_as_its_note(solo_run, tmp_path):
    """The dashboard's header, toast, Log tab and the terminal's summary after `kill -9` of a node
    that resumes a run (whose stderr's last line is the informational resume note)."""
    run = tmp_path / "run"
    shutil.copytree(solo_run.run, run, ignore=shutil.ignore_patterns("node.lock"))
    cmd = [sys.executable, "-m", "ftis_edge.cli", "start", "--headless", "--run-dir", str(run), "--resume",
           "--rounds", "4"]
    proc, stderr_file = rundir.spawn_node(cmd, run)
    try:
        assert wait_for(lambda: "note: resuming with the run's settings" in stderr_file[0].read_text(), 120)
        app = DashboardApp(run, node_process=proc, node_stderr=stderr_file, poll_interval=FAST)
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause(0.3)      # the dashboard's first poll sees the node alive before the kill
            proc.send_signal(signal.SIGKILL)
            await settle(pilot, lambda: app.failure is not None, timeout=30)
            await pilot.pause(0.2)
            assert app.failure == "killed by SIGKILL (kill -9, or the system ran out of memory)"
            assert app.sub_title.startswith("node killed by SIGKILL")
            toasts = [(n.title, str(n.message)) for n in app._notifications]
            assert any(t == "node killed" and m.startswith("killed by SIGKILL") for t, m in toasts), toasts
            assert not any("note:" in m for _, m in toasts)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -9
    summary = rundir.stop_summary(run, exit_code=proc.returncode, failure=rundir.last_error_line(*stderr_file),
                                  program="ftis-edge")
    assert summary.splitlines() == [
        "the node was killed by SIGKILL (kill -9, or the system ran out of memory) after round 2",
        f"  resume    ftis-edge start --run-dir {run} --resume"]


# ---- item 5: a watcher changes nothing without a confirmed key -------------------------------------
def footer(app) -> str:
    return screen_text(app).splitlines()[-1]


async def test_watching_shows_q_leave_and_p_asks_first(tmp_path):
    run = live_copy(tmp_path)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        line = footer(app)
        assert "q leave" in line and "p pause…" in line and "S stop…" in line, line
        assert "q stop" not in line and "p pause " not in line + " "
        await pilot.press("p")                       # one p pauses nothing
        await pilot.pause(0.2)
        assert read_control(run)["pause"] is False
        assert any("pause this node for everyone using it? y" in str(n.message) for n in app._notifications)
        await pilot.press("y")
        assert read_control(run)["pause"] is True


async def test_our_own_node_keeps_q_stop_and_p_pause(tmp_path):
    run = live_copy(tmp_path)
    node = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])    # a live process we own
    try:
        app = DashboardApp(run, node_process=node, poll_interval=FAST)
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            line = footer(app)
            assert "q stop" in line and "p pause" in line and "leave" not in line and "S stop" not in line, line
            await pilot.press("p")
            assert read_control(run)["pause"] is True
    finally:
        node.kill()
        node.wait()


# ---- item 7: RUN/config.toml edited while the node runs --------------------------------------------
async def test_an_edit_of_the_record_while_running_is_said_on_the_dashboard_and_in_the_summary(tmp_path):
    run = a_run(tmp_path / "run", rounds=30, checkpoint_round=3)
    app = DashboardApp(run, poll_interval=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.2)
        text = (run / "config.toml").read_text().replace("rounds = 30", "rounds = 50")
        assert "rounds = 50" in text
        (run / "config.toml").write_text(text)
        await settle(pilot, lambda: any(n.title == "config.toml changed" for n in app._notifications))
        from textual.widgets import Log
        assert any("changed while the node runs (node.rounds: 30 → 50)" in ln for ln in app.query_one("#log", Log).lines)
    records(run, {"type": "stop", "round": 3, "reason": "user", "time": time.time()})
    from ftis_edge.store.record_watch import edits_line
    block = rundir.stop_summary(run, program="ftis-edge", edited=edits_line(run, running=False)).splitlines()
    assert f"  config    {run / 'config.toml'} was edited while the node ran (node.rounds: 30 → 50): not used yet, " \
           f"it applies on resume" in block


# ---- item 8: words that name what happened and what the user called things ------------------------
def test_a_dashboard_stop_is_not_called_q():
    assert rundir.stop_words("user") == "stopped from the dashboard (q, Ctrl-C, or S then y)"


def test_an_exported_model_is_named_after_its_run_not_model_f16():
    cfg = config.from_dict({"model": {"spec": "runs/expert/export/model-f16.gguf"}})
    assert cfg.model_label == "expert-f16"
    assert config.from_dict({"model": {"spec": "/tmp/gift/model-q8_0.gguf"}}).model_label == "gift-q8_0"


@pytest.mark.model
def test_the_memory_line_names_the_model_as_the_user_did(tmp_path):
    r = cli("init", str(tmp_path / "node.toml"))
    assert r.returncode == 0, r.stderr
    assert "memory: smollm2-135m (135M" in r.stdout and "Smollm2 135M 8k" not in r.stdout, r.stdout


def test_a_jsonl_with_other_field_names_names_the_setting_once(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1?", "solution": "{i + 1}"}}\n' for i in range(9)))
    r = cli("eval", "--task", "jsonl", "--path", str(data), "--limit", "1")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"ftis-edge eval: error: {data}: every line (9) misses a field it needs: line 1 has 'prompt', 'solution', "
        f"not 'question' and 'answer'; name the fields your file uses with task.question_field = \"…\" and "
        f"task.answer_field = \"…\" in the [task] section")


# ---- item 10: the saving in the stop summary ----------------------------------------------------------
def test_the_stop_summary_shows_the_saving_beside_held_out(tmp_path):
    run = tmp_path / "run"
    records(run, {"type": "start", "config": {"node": {"rounds": 10}}},
            {"type": "round", "round": 1, "eval/base_accuracy": 0.25, "peers/saved_frac": 0.5},
            {"type": "round", "round": 9, "eval/accuracy": 0.41, "peers/saved_frac": 0.22},
            {"type": "round", "round": 10, "peers/saved_frac": None},
            {"type": "stop", "round": 10, "reason": "steps"})
    block = rundir.stop_summary(run, program="ftis-edge").splitlines()
    held = block.index("  held-out  best 41% at round 9 (base model 25%), 41% at the end")
    assert block[held + 1] == ("  saved     22% of your generation: groups peers supplied trained in place of "
                               "your own (through round 9)")


# ---- item 11: --help says each default once --------------------------------------------------------
def test_help_names_each_default_once():
    export = subprocess.run([sys.executable, "-m", "ftis_edge.cli", "export", "--help"], cwd=ROOT,
                            capture_output=True, text=True, env=dict(os.environ, COLUMNS="300")).stdout
    assert "the model card (default 50; 0 = skip)" in export
    relay = subprocess.run([sys.executable, "-m", "relay", "--help"], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, COLUMNS="300")).stdout
    line = next(ln for ln in relay.splitlines() if ln.strip().startswith("--name"))
    assert line.count("(default:") == 1 and line.endswith("(default: HOST:PORT)"), line


# ---- issue 62 item 5: strings from disk print inert ------------------------------------------------
def test_the_sanitiser_escapes_controls_always_and_markup_for_markup():
    from rich.console import Console
    from ftis_edge.common.text_safety import shown
    plain = shown(EVIL)
    assert ESC not in plain and "\x07" not in plain and "[link=" in plain      # a print shows the text
    console = Console(record=True, force_terminal=True, width=300)
    console.print("converting " + shown(EVIL, markup=True))
    out = console.export_text(styles=False)
    assert "converting " + EVIL_SHOWN in out and ESC not in out
    assert "\x1b]8;" not in console.export_text(styles=True)        # no OSC 8 hyperlink was written
    assert shown("smollm2-135m", markup=True) == "smollm2-135m" and shown("[task] x") == "[task] x"


@pytest.mark.model
def test_a_shared_run_naming_an_evil_model_folder_prints_it_inert(smol, tmp_path):
    """`export` of a run directory whose config.toml names a folder with markup and escapes as its
    model, and `eval --model` of that folder's GGUF: no escape byte and no live markup reaches the terminal."""
    evil = tmp_path / EVIL
    evil.mkdir()
    (evil / "model.gguf").symlink_to(smol.gguf_path)
    spec = str(evil / "model.gguf")
    run = a_run(tmp_path / "run", checkpoint_round=1, spec=spec)
    r = cli("export", str(run), "--eval-limit", "0", "--quant", "f16", "--to", str(tmp_path / "out"))
    out = r.stdout + r.stderr
    assert ESC not in out and "\x07" not in out, out
    assert f"loaded {tmp_path}/{EVIL_SHOWN}/model.gguf" in out
    assert "chooses the model" in out                              # the outside-the-run note, inert too
    r = cli("eval", "--model", spec, "--limit", "1", "--max-new-tokens", "4", "--quiet",
            env=dict(os.environ, COLUMNS="400"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert ESC not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr
    assert EVIL_SHOWN in "".join(r.stdout.split())     # the table's title (Rich wraps it), literal


# ---- item 9: what quantisation costs, and a default that does not cost a small model its training --
def test_the_default_quantisation_follows_the_model_size():
    from ftis_edge.export import default_quant
    assert default_quant(135_000_000) == "q8_0" and default_quant(270_000_000) == "q8_0"
    assert default_quant(1_700_000_000) == "q4_k_m"


def test_a_paired_cost_is_said_with_its_interval_or_as_no_change():
    from ftis_edge.export import change_words, paired
    f16 = {"correct": [True] * 30 + [False] * 20}
    q = {"correct": [True] * 26 + [False] * 4 + [True] * 1 + [False] * 19}     # 4 lost, 1 gained
    # SE = sqrt(4 + 1 - 3**2 / 50) / 50 = 0.0439: -6.0 +- 1.96 * 4.39 points
    assert change_words(paired(q, f16), "F16") == ("-6.0 points against F16 on the same 50 prompts (95% interval "
                                                   "-14.6 to +2.6; 4 answers lost, 1 gained)")
    assert change_words(paired(f16, f16), "F16") == "the same answers as F16 on all 50 prompts"


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_export_says_what_the_shipped_file_costs_against_f16(lora_run, tmp_path):
    """`ftis-edge export RUN` with its defaults on the real SmolLM2 run: q8_0 chosen for a 135M
    model, and its cost against F16 paired on the same prompts, with the interval, on the
    terminal, in export.json and in the card."""
    out = tmp_path / "export"
    r = cli("export", str(lora_run), "--to", str(out), "--eval-limit", "8", "--threads", "1", timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "quantisation q8_0: the default for a model of 135M parameters" in r.stdout
    import json
    ev = json.loads((out / "export.json").read_text())["eval"]
    cost = ev["quant_cost"]
    assert cost["quant"] == "q8_0" and cost["n"] == 8 and cost["file"] == "model-q8_0.gguf"
    from ftis_edge.export import change_words
    words = change_words(cost, "F16")
    assert f"the q8_0 file (model-q8_0.gguf) {ev['shipped']['accuracy']:.1%}: {words}" in r.stdout
    assert "held-out accuracy at F16: before" in r.stdout and "(greedy, n=8): training " in r.stdout
    assert f"Paired on the same prompts: the q8_0 file (model-q8_0.gguf)" in (out / "README.md").read_text()


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_real_node_logs_an_edit_of_its_record_and_goes_on_with_its_settings(tmp_path):
    from ftis_edge.metrics.records import read_rounds
    from ftis_edge.store.record_watch import edits
    from procs import finish, start_node, write_config
    cfg = write_config(tmp_path, "w", node={"rounds": 3, "checkpoint_every": 1})
    run = tmp_path / "w"
    proc = start_node(cfg)
    try:
        assert wait_for(lambda: len(read_rounds(run)) >= 1, 900, every_s=0.5), "round 1"
        assert edits(run) == []                  # the record as the node wrote it: nothing to say
        text = (run / "config.toml").read_text()
        import re
        (run / "config.toml").write_text(re.sub(r"^rounds = 3$", "rounds = 9", text, count=1, flags=re.M))
        out = finish(proc, 1200)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = (f"{run / 'config.toml'} changed while the node runs (node.rounds: 3 → 9): a node reads it when it "
            f"starts, so this run goes on with its settings; the edit applies when you resume it: "
            f"python -m ftis_edge.cli start --run-dir {run} --resume")
    assert said in out and said in (run / "node.log").read_text()
    assert len(read_rounds(run)) == 3                    # the run kept its 3 rounds


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_dashboard_whose_node_is_killed_says_so_and_exits_128_plus_the_signal(tmp_path):
    """`ftis-edge start` in a real terminal (a pty): its node is killed with SIGKILL; the dashboard
    says so, q leaves, the terminal then reads what happened and the command exits 137 (was 247)."""
    import fcntl
    import pty
    import struct
    import termios
    import threading
    from procs import write_config
    cfg = write_config(tmp_path, "k", node={"rounds": 2})
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    dash = subprocess.Popen([sys.executable, "-m", "ftis_edge.cli", "start", str(cfg)], cwd=ROOT, stdin=slave,
                            stdout=slave, stderr=slave, start_new_session=True,
                            env=dict(os.environ, TERM="xterm-256color"))
    os.close(slave)
    seen = bytearray()

    def drain():
        try:
            while chunk := os.read(master, 65536):
                seen.extend(chunk)
        except OSError:
            pass
    threading.Thread(target=drain, daemon=True).start()

    def node_pid():
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if stat.rsplit(")", 1)[1].split()[1] == str(dash.pid) and b"--headless" in cmd:
                return int(entry.name)
        return None
    try:
        assert wait_for(lambda: node_pid() is not None and (tmp_path / "k" / "node.stderr").exists(), 120)
        os.kill(node_pid(), signal.SIGKILL)
        # the dashboard shows the failure until the user leaves (q)
        assert wait_for(lambda: b"killed" in bytes(seen), 60), bytes(seen)[-2000:]
        os.write(master, b"q")
        assert dash.wait(120) == 137
    finally:
        if dash.poll() is None:
            dash.kill()
        time.sleep(0.2)
        os.close(master)
    text = seen.decode("utf-8", errors="replace")
    assert "the node was killed by SIGKILL (kill -9, or the system ran out of memory) after round 0" in text
