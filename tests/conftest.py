import os
import sys

# tests/ holds shared helpers (procs.py) imported by several test files; the repository root holds
# the experiments and benchmarks packages some tests read (`pytest` alone does not put it on the path).
_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _TESTS)
if os.path.dirname(_TESTS) not in sys.path:
    sys.path.insert(1, os.path.dirname(_TESTS))


import pytest  # noqa: E402


@pytest.fixture
def relay():
    """``relay(*flags, keys=None, port=None, log_level="WARNING")``: a real relay process on
    loopback, ready to answer; every one started is killed at the end of the test."""
    from procs import RelayProc
    procs = []

    def make(*args, keys=None, port=None, log_level="WARNING"):
        r = RelayProc(*args, port=port, log_level=log_level)
        procs.append(r)
        r.wait_ready(keys)
        return r
    yield make
    for r in procs:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()


@pytest.fixture(scope="session")
def smol():
    """The default model's bundle (SmolLM2-135M), its tokenizer loaded: one per session."""
    from ftis_edge.models.resolve import resolve_model
    bundle = resolve_model("smollm2-135m")
    bundle.tokenizer()
    return bundle


@pytest.fixture(scope="session")
def task():
    """The built-in arith task (binary reward), as a node without settings runs it."""
    from ftis_edge.tasks import get_task
    return get_task("arith")


@pytest.fixture(scope="session")
def solo_run(tmp_path_factory):
    """The default node alone (procs.TINY) for 2 rounds, a checkpoint every round, run once for
    the session: ``.run`` its run directory, ``.phases`` what its progress.json announced while
    it ran, ``.output`` what it printed. Tests only read it."""
    from types import SimpleNamespace

    from procs import run_node_watching, write_config
    folder = tmp_path_factory.mktemp("solo")
    cfg = write_config(folder, "solo", node={"rounds": 2, "checkpoint_every": 1})
    output, phases = run_node_watching(cfg, folder / "solo")
    return SimpleNamespace(run=folder / "solo", phases=phases, output=output)


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory):
    """One round of the default node (procs.TINY: LoRA, llama.cpp), checkpointed, trained once for
    the session: its run directory. Tests export it (by the API into their own folder, by the
    command line into its export/ or --to a folder) and read it; none trains it further."""
    from procs import run_node, write_config
    folder = tmp_path_factory.mktemp("export")
    run_node(write_config(folder, "lora", node={"rounds": 1, "checkpoint_every": 1}), timeout=1200)
    return folder / "lora"
