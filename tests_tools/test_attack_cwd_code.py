"""benchmarks/attacks/cwd_code.py, the committed attack (issue 51 item 1): no child this project
starts imports code planted in the current directory, and the unprotected control does (moved from
tests/test_child_path.py: the product's tests import only the product)."""
from benchmarks.attacks import cwd_code


def test_attack_script_every_child_clean_control_fires(capsys):
    """The committed attack on the real grader, dashboard child, converter and console script."""
    cwd_code.main([])
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    for case in ("grader", "dashboard", "converter", "console"):
        assert lines[case].startswith(("clean", "skipped")), (case, lines[case])
    assert lines["grader"].startswith("clean  (graded [True, False])")
    assert lines["control"].startswith("ran: csv"), lines["control"]      # the attack itself works
