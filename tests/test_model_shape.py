"""A model folder whose config.json claims a shape its weights cannot back is refused before
anything allocates it (issue 62.7: 200,000 layers over one layer of weights grew until killed)."""
import json
import time

import pytest

from ftis_edge.models.resolve import ModelError, resolve_model
from ftis_edge.models.shape_check import claimed_params, unbacked_claim


def _folder(path, layers_claimed: int, layers_held: int, hidden: int = 16):
    import torch
    from safetensors.torch import save_file
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": hidden,
        "num_hidden_layers": layers_claimed, "num_attention_heads": 2, "num_key_value_heads": 2,
        "intermediate_size": 2 * hidden, "max_position_embeddings": 64}))
    weights = {"model.embed_tokens.weight": torch.zeros(64, hidden)}
    for i in range(layers_held):
        for name, shape in (("self_attn.q_proj", (hidden, hidden)), ("self_attn.k_proj", (hidden, hidden)),
                            ("self_attn.v_proj", (hidden, hidden)), ("self_attn.o_proj", (hidden, hidden)),
                            ("mlp.gate_proj", (2 * hidden, hidden)), ("mlp.up_proj", (2 * hidden, hidden)),
                            ("mlp.down_proj", (hidden, 2 * hidden))):
            weights[f"model.layers.{i}.{name}.weight"] = torch.zeros(*shape)
    save_file(weights, str(path / "model.safetensors"))
    return path


def test_a_claim_of_200000_layers_over_one_is_refused_in_one_line_before_loading(tmp_path):
    folder = _folder(tmp_path / "m", 200_000, 1, hidden=64)
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as e:
        resolve_model(str(folder))
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert "\n" not in msg and "claims 200,000 layers" in msg and "in 1 layers" in msg, msg


def test_weights_that_back_the_claim_pass(tmp_path):
    for held in (1, 4):
        folder = _folder(tmp_path / f"m{held}", held, held, hidden=64)
        assert unbacked_claim(folder) is None
        assert resolve_model(str(folder)).spec == str(folder)
    assert unbacked_claim(_folder(tmp_path / "fewer", 2, 4)) is None        # fewer claimed than held: no cost
    assert claimed_params({"text_config": {"num_hidden_layers": 2, "hidden_size": 4, "intermediate_size": 8,
                                           "vocab_size": 10}}) == (2, 2 * (64 + 96) + 40)   # Gemma 3's text part


def test_a_malformed_weights_header_is_refused_not_read(tmp_path):
    folder = _folder(tmp_path / "m", 1, 1)
    (folder / "model.safetensors").write_bytes((1 << 60).to_bytes(8, "little") + b"{}")
    assert "claims a header of" in unbacked_claim(folder)
    with pytest.raises(ModelError, match="refused: unreadable"):
        resolve_model(str(folder))
