"""Your own JSONL file: the whole file is checked when the task is built; every bad line is named
in file order (the first ten, then a count), broken JSON with its column, a non-numeric answer
under grade = "math" is an error, and the split into training and held-out lines is said."""
from __future__ import annotations

import json
import logging

import pytest

from ftis_edge.tasks import TaskError, get_task


def test_every_bad_line_in_file_order_with_columns(tmp_path):
    path = tmp_path / "mine.jsonl"
    good = json.dumps({"question": "2+2?", "answer": "4"})
    lines = [good, good,
             json.dumps({"question": "How many pens?", "answer": "ten pens"}),      # line 3: words under math
             good,
             '{"question": "3+3?", "answer": 6',                                     # line 5: broken JSON
             json.dumps({"answer": "7"}),                                            # line 6: no question
             good]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskError) as info:
        get_task("jsonl", path=str(path))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: 3 bad lines of 7 — line 3: answer 'ten pens' is not a number or math expression")
    assert msg.index("line 3:") < msg.index("line 5:") < msg.index("line 6:")
    assert "line 5: not valid JSON at column 33 (Expecting ',' delimiter)" in msg
    assert "line 6: missing text field 'question'" in msg
    # the same file is fine graded as text
    path.write_text("\n".join(ln for i, ln in enumerate(lines, 1) if i not in (5, 6)) + "\n")
    assert get_task("jsonl", path=str(path), grade="exact", eval_fraction=0.0).splits["train"]


def test_many_bad_lines_show_ten_then_a_count(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(["not json"] * 25 + [json.dumps({"question": "q", "answer": "1"})]) + "\n")
    with pytest.raises(TaskError) as info:
        get_task("jsonl", path=str(path))
    msg = str(info.value)
    assert msg.count("not valid JSON at column 1") == 10 and msg.endswith("; and 15 more")
    assert "line 1:" in msg and "line 10:" in msg and "line 11:" not in msg


def test_the_split_is_said(tmp_path, caplog):
    path = tmp_path / "ok.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"{i}+1?", "answer": i + 1}) for i in range(20)) + "\n")
    with caplog.at_level(logging.INFO, logger="ftis_edge.tasks.jsonl_task"):
        task = get_task("jsonl", path=str(path), eval_fraction=0.1)
    assert task.split_summary == f"jsonl: {path}: 18 lines for training, 2 held out (eval_fraction = 0.1)"
    assert task.split_summary in caplog.text
