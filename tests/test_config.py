"""The node file: defaults, validation errors that name the key, the commented template."""
from ftis_edge.config import tomllib

import pytest

from ftis_edge import config as c


def test_defaults_are_the_offline_default_node():
    cfg = c.load(None)
    assert cfg.model.spec == "smollm2-135m" and cfg.model.backend == "auto"   # llamacpp on a CPU
    assert cfg.model.device == "auto"
    assert cfg.train.trainable == "lora" and cfg.task.name == "arith"
    assert cfg.train.method == "f-tis" and cfg.train.C == 2.0 and cfg.train.epsilon == 0.2
    assert cfg.mode == "alone"                     # no relay -> alone, whatever collaboration says
    assert cfg.swarm.collaboration == "vertical"


def test_template_round_trips_and_documents_every_key():
    text = c.to_toml(c.Config())
    parsed = tomllib.loads(text)
    assert c.from_dict(parsed).to_dict() == c.Config().to_dict()
    for section, values in c.Config().to_dict().items():
        for key in values:
            assert f"\n{key} = " in text, key
    # every setting is preceded by a comment line
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if " = " in line and not line.startswith("#"):
            assert lines[i - 1].startswith("#"), line


@pytest.mark.parametrize("data, key", [
    ({"task": {"num_generations": 1}}, "task.num_generations"),
    ({"task": {"gruop_size": 8}}, "task.gruop_size"),
    ({"train": {"method": "ppo"}}, "train.method"),
    ({"node": {"rounds": True}}, "node.rounds"),
    ({"train": {"learning_rate": float("nan")}}, "train.learning_rate"),
    ({"train": {"lora_targets": "q_proj"}}, "train.lora_targets"),
    ({"model": {"backend": "vllm"}}, "model.backend"),
    ({"swarm": {"relay": "localhost:5555"}}, "swarm.relay"),
    ({"swarm": {"server_key": "/nonexistent"}}, "swarm.server_key"),
    ({"nodes": {}}, "nodes"),
    ({"task": 3}, "task"),
    ({"task": {"top_p": 0.0}}, "task.top_p"),
])
def test_bad_values_name_the_key(data, key):
    with pytest.raises(c.ConfigError) as e:
        c.from_dict(data)
    assert str(e.value).startswith(key + ":"), str(e.value)


def test_typo_gets_a_suggestion():
    with pytest.raises(c.ConfigError, match="did you mean 'kl_threshold'"):
        c.from_dict({"train": {"kl_treshold": 5}})


@pytest.mark.parametrize("old, new", sorted(c.RENAMED.items()))
def test_a_renamed_key_says_its_new_name(old, new):
    section, key = old.split(".")
    with pytest.raises(c.ConfigError) as e:
        c.from_dict({section: {key: 1}})
    assert str(e.value) == f"{old}: renamed to TRL's name (did you mean '{new}'?)"
    section, key = new.split(".")
    assert hasattr(getattr(c.Config(), section), key)


def test_trl_table_lists_the_renamed_keys():
    table = c.trl_table()
    for new in c.RENAMED.values():
        assert f"| `{new}` | `{new.split('.')[1]}` | yes" in table


def test_int_is_accepted_for_float_and_overrides_apply(tmp_path):
    p = tmp_path / "node.toml"
    p.write_text('[train]\nlearning_rate = 1\n[node]\nid = "a"\nrun_dir = "%s/{id}"\n' % tmp_path)
    cfg = c.load(p, {"swarm.relay": "tcp://127.0.0.1:5555"})
    assert cfg.train.learning_rate == 1.0 and isinstance(cfg.train.learning_rate, float)
    assert cfg.mode == "vertical" and cfg.run_path == tmp_path / "a"


def test_file_errors_are_one_clear_line(tmp_path):
    with pytest.raises(c.ConfigError, match="no such config file"):
        c.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = ")
    with pytest.raises(c.ConfigError, match="not valid TOML"):
        c.load(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(c.ConfigError, match="UTF-8"):
        c.load(binary)


def test_reference_table_lists_every_key():
    table = c.reference_table()
    for section, values in c.Config().to_dict().items():
        for key in values:
            assert f"`{section}.{key}`" in table


def test_validation_checks_task_names_without_loading_the_task_package():
    """A config is read (and its task name checked) without importing ftis_edge.tasks: that
    package pulls in the grader. Probed in a fresh interpreter, as test_import_cycles' NO_TORCH."""
    import subprocess
    import sys
    probe = ("import sys; from ftis_edge import config; config.from_dict({'task': {'name': 'gsm8k'}}); "
             "print(' '.join(m for m in sys.modules if m.startswith('ftis_edge.tasks')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == []          # neither ftis_edge.tasks nor ftis_edge.tasks.grader
    with pytest.raises(c.ConfigError, match=r"task.name: unknown task 'gsm9k'; choose one of arith, gsm8k"):
        c.from_dict({"task": {"name": "gsm9k"}})
    from ftis_edge import tasks
    assert tasks.TASK_NAMES == tasks.registry.BUILTIN        # one list: the light module's
