"""Attack: code from the current directory (issue 51 item 1).

A shared run directory holds modules named like the standard library (``csv.py``, ``argparse.py``,
``json.py``, ``queue.py``, ``runpy.py``…). Each one appends its name to a marker file and then
hands over the real module, so that the command still succeeds as if nothing happened. We ``cd``
into that directory and run what this project runs there:

* ``grader``     — the grader worker every grading command starts (a real math answer graded);
* ``dashboard``  — the dashboard's child ``… -m ftis_edge.cli start …`` (here with ``--help``);
* ``converter``  — llama.cpp's converter runner (here on a file that is no model: it fails after
  its imports, which is the part that matters);
* ``console``    — the ``ftis-edge`` console script itself (``eval --help``);
* ``control``    — a plain ``python -c 'import csv'`` child, the unprotected way (must fire).

Run: ``python -m benchmarks.attacks.cwd_code [--tree OLD_CHECKOUT]`` (``--tree``: that checkout's
code is measured, the "before" numbers). Prints one line per case: ``ran: <modules>`` or ``clean``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import ROOT, parser, write_json
from testkit.hostile import CONSOLE_SCRIPT, plant


def _ran(marker: Path) -> list[str]:
    if not marker.exists():
        return []
    names = sorted(set(marker.read_text().split()))
    marker.unlink()
    return names


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--tree", type=Path, default=ROOT,
                    help="measure this checkout's ftis_edge (default: this one; an older one: the \"before\" numbers)")
    args = ap.parse_args(argv)
    # The parents below start in the run directory: the tree under test first on PYTHONPATH, and
    # this shell's entries made absolute (a "." of ours is not the run directory).
    entries = [str(args.tree.resolve())] + [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(entries)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="ftis-cwd-") as tmp:
        run, marker = Path(tmp) / "run", Path(tmp) / "marker"
        run.mkdir()
        plant(run, marker)
        (Path(tmp) / "bin").mkdir()
        script = Path(tmp) / "bin" / "ftis-edge"
        script.write_text(f"#!{sys.executable}\n" + CONSOLE_SCRIPT, encoding="utf-8")
        (run / "not-a-model").mkdir()
        converter = _converter_present()
        cases = {
            "grader": [sys.executable, "-c", PARENT + GRADE],
            "dashboard": [sys.executable, "-c", PARENT + DASHBOARD],
            "converter": [sys.executable, "-c", PARENT + CONVERT] if converter else None,
            "console": [sys.executable, str(script), "eval", "--help"],
            "control": [sys.executable, "-c", "import csv"],
        }
        for name, cmd in cases.items():
            if cmd is None:
                results[name] = "skipped (llama.cpp's converter is not installed)"
                print(f"{name:10s} {results[name]}", flush=True)
                continue
            r = subprocess.run(cmd, cwd=run, env=env, capture_output=True, text=True, timeout=600)
            ran = _ran(marker)
            last = (r.stdout.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            results[name] = (f"ran: {','.join(ran)}" if ran else "clean") + f"  ({last[:120]})"
            print(f"{name:10s} {results[name]}", flush=True)
    write_json(args.json, results)
    return 0


# Each parent stands for `cd RUN && ftis-edge …` (a console script: the run directory is not on
# its own sys.path), with a stray ':' in PYTHONPATH (read as the current directory by a child
# that inherits it); what is measured is the child that the project's own code starts.
PARENT = """import sys, os
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
os.environ["PYTHONPATH"] = os.environ.get("PYTHONPATH", "") + os.pathsep
"""
GRADE = """from ftis_edge.tasks.grader import Grader
g = Grader()
print("graded", [g.verify(a, r, 120).correct for a, r in (("\\\\frac{1}{2}", "0.5"), ("7", "8"))])
g.close()
"""
DASHBOARD = """from pathlib import Path
from ftis_edge.store import rundir
try:
    from ftis_edge.common.child import python_command
    cmd = python_command("-m", "ftis_edge.cli", "start", "--help")
except ImportError:                     # the tree before the fix: what cli.py built then
    cmd = [sys.executable, "-m", "ftis_edge.cli", "start", "--help"]
proc, _ = rundir.spawn_node(cmd, Path("dash"))
print("dashboard child exit", proc.wait())
"""
CONVERT = """from ftis_edge.models.gguf_io import GGUFError, convert_hf_to_gguf
try:
    convert_hf_to_gguf("not-a-model", "out.gguf")
except GGUFError as e:
    print("converter:", str(e)[-80:])
"""


def _converter_present() -> bool:
    from ftis_edge.models.gguf_io import converter_dir
    return (converter_dir() / "convert_hf_to_gguf.py").is_file()


if __name__ == "__main__":
    raise SystemExit(main())
