"""Will it fit? Memory a node needs, estimated from the model's shape before anything is loaded.

The shape comes from the GGUF header (``gguf_io.read_gguf_header``, ~0.1 s, no weights) or an HF
``config.json``. The estimate adds up what a node holds at its peak (a training step):

* runtime: Python, torch, transformers, llama.cpp, the tokenizer (measured, benchmarks/bench_fit.py);
* learner (on its device): float32 weights; full fine-tuning adds gradients and two Adam moments
  (12 B per parameter), LoRA only its adapters (16 B per adapter parameter); activations kept for
  the backward pass (a micro-batch's tokens: its prompts once, its completions, x layers x the
  tensors a decoder layer keeps) and one chunk of [rows, vocab] logits (LOGIT_CHUNK_ROWS);
* generator: what its backend class says (``memory``, generate/): llama.cpp (always in RAM) holds
  its own weights (F16 re-export: 2 B per parameter; "quantized": the shipped GGUF) and a KV cache
  for a group (G sequences of prompt + completion); the hf backend samples from the learner's
  weights and adds only its KV cache, on the learner's device.

``check`` compares the total with the machine (/proc/meminfo or sysconf; ``torch.cuda.mem_get_info``
on CUDA) and says in one line what to change when it does not fit.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from ..generate.registry import BACKENDS, DEFAULT, backend_class, resolve
from .logit_chunks import LOGIT_CHUNK_ROWS, LOGIT_COPIES
from .precision import activation_bytes

GB = 1024 ** 3
RUNTIME_BYTES = int(0.45 * GB)     # a node process before any model: its imports + tokenizer (bench_fit.py: 0.41)
CUDA_CONTEXT_BYTES = int(0.5 * GB)  # the CUDA context and torch's allocator slack on a GPU
DEFAULT_PROMPT_TOKENS = 256        # a prompt with the default 2 worked examples (arith on SmolLM2: 173)
HEADROOM = 0.9                     # use at most this share of what the machine has


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: sizes, never weights."""
    name: str
    n_params: int
    hidden: int
    ffn: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    vocab: int
    file_bytes: int | None = None      # the GGUF as shipped (its quantization), when there is one

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim


def shape_from_gguf(path) -> ModelShape:
    from ..models.gguf_io import read_gguf_header
    meta, tensors = read_gguf_header(path)
    arch = meta["general.architecture"]
    get = lambda key, default=None: meta.get(f"{arch}.{key}", default)   # noqa: E731
    hidden, n_head = int(get("embedding_length")), int(get("attention.head_count"))
    return ModelShape(
        name=str(meta.get("general.name") or Path(path).stem), n_params=sum(n for _, n in tensors),
        hidden=hidden, ffn=int(get("feed_forward_length")), n_layer=int(get("block_count")), n_head=n_head,
        n_head_kv=int(get("attention.head_count_kv", n_head)),
        head_dim=int(get("attention.key_length", hidden // n_head)),
        vocab=int(meta.get("tokenizer.ggml.tokens") or get("vocab_size")), file_bytes=os.path.getsize(path))


def shape_from_hf_config(cfg: dict, name: str = "model") -> ModelShape:
    """From a transformers config.json (a multimodal wrapper's ``text_config`` too); the parameter
    count of a llama-style decoder (attention, gated MLP, norms, embeddings, a separate head unless tied)."""
    c = cfg.get("text_config", cfg)
    hidden, n_head, n_layer = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    n_kv = c.get("num_key_value_heads") or n_head
    head_dim = c.get("head_dim") or hidden // n_head
    ffn, vocab = c["intermediate_size"], c["vocab_size"]
    tied = c.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
    per_layer = hidden * (n_head * head_dim) * 2 + hidden * (n_kv * head_dim) * 2 + 3 * hidden * ffn + 2 * hidden
    n_params = vocab * hidden * (1 if tied else 2) + n_layer * per_layer + hidden
    return ModelShape(name=name, n_params=n_params, hidden=hidden, ffn=ffn, n_layer=n_layer, n_head=n_head,
                      n_head_kv=n_kv, head_dim=head_dim, vocab=vocab)


def shape_of(bundle, name: str | None = None) -> ModelShape:
    """A ``models.ModelBundle``'s shape: from its GGUF header, else its HF config.json; ``name``:
    the model as the user called it (config.model_label), not the GGUF's internal general.name."""
    if bundle.gguf_path is not None:
        shape = shape_from_gguf(bundle.gguf_path)
        return replace(shape, name=name) if name else shape
    cfg_path = Path(bundle.hf_dir()) / "config.json"
    return shape_from_hf_config(json.loads(cfg_path.read_text()), name or bundle.name)


@dataclass(frozen=True)
class Setup:
    """The config choices memory depends on (``Setup.from_config``)."""
    trainable: str = "lora"
    backend: str = DEFAULT             # generator (registry.BACKENDS); its class says where its memory sits
    device: str = "cpu"                # learner: cpu, cuda, mps
    train_precision: str = "auto"      # learner: train.precision (precision.py decides the dtype)
    precision: str = "f16"             # llama.cpp weights: f16 re-export or the quantized GGUF
    micro_batch: int = 8
    group: int = 8                     # G: sequences the generator decodes together
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    completion_tokens: int = 128
    lora_r: int = 8
    lora_targets: tuple = ("q_proj", "k_proj", "v_proj", "o_proj")

    @classmethod
    def from_config(cls, cfg, *, device: str | None = None, backend: str | None = None,
                    prompt_tokens: int | None = None) -> "Setup":
        dev = device or (cfg.model.device if cfg.model.device != "auto" else "cpu")
        be = backend or resolve(cfg.model.backend)
        return cls(trainable=cfg.train.trainable, backend=be, device=dev, train_precision=cfg.train.precision,
                   precision=cfg.model.precision,
                   micro_batch=cfg.train.micro_batch, group=cfg.task.num_generations,
                   prompt_tokens=prompt_tokens or DEFAULT_PROMPT_TOKENS,
                   completion_tokens=cfg.task.max_completion_length, lora_r=cfg.train.lora_r,
                   lora_targets=tuple(cfg.train.lora_targets))


def _lora_params(s: ModelShape, targets, r: int) -> int:
    dims = {"q_proj": (s.hidden, s.q_dim), "k_proj": (s.hidden, s.kv_dim), "v_proj": (s.hidden, s.kv_dim),
            "o_proj": (s.q_dim, s.hidden), "gate_proj": (s.hidden, s.ffn), "up_proj": (s.hidden, s.ffn),
            "down_proj": (s.ffn, s.hidden)}
    return s.n_layer * sum(r * (a + b) for a, b in (dims[t] for t in targets if t in dims))


def _activation_floats_per_token(s: ModelShape, trainable: str) -> int:
    """Floats one decoder layer keeps per token for the backward pass. A frozen linear keeps no
    input (its input's gradient needs only the weight), so under LoRA (on q/k/v/o) a layer keeps:
    the two norms' inputs and results (4 h), the attention's q, k, v and output (2 q_dim + 2 kv),
    the gated MLP's gate, activation and up tensors (3 ffn). Full fine-tuning adds the inputs of
    the MLP's linears (h + ffn)."""
    lora = 4 * s.hidden + 2 * s.q_dim + 2 * s.kv_dim + 3 * s.ffn
    return lora + (s.hidden + s.ffn if trainable == "full" else 0)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass
class Estimate:
    ram: dict            # part -> bytes in RAM
    vram: dict           # part -> bytes on the GPU (empty on CPU)

    @property
    def ram_bytes(self) -> int:
        return sum(self.ram.values())

    @property
    def vram_bytes(self) -> int:
        return sum(self.vram.values())

    def line(self) -> str:
        """``RAM 4.1 GB (learner 3.0, generator 0.3, runtime 0.8)``, and the GPU's share when one is used."""
        def groups(parts: dict) -> str:
            sums: dict = {}
            for k, v in parts.items():
                sums[_GROUP.get(k, k)] = sums.get(_GROUP.get(k, k), 0) + v
            return ", ".join(f"{k} {v / GB:.1f}" for k, v in sums.items())
        text = f"RAM {self.ram_bytes / GB:.1f} GB ({groups(self.ram)})"
        if self.vram:
            text += f", GPU {self.vram_bytes / GB:.1f} GB ({groups(self.vram)})"
        return text


_GROUP = {"weights": "learner", "grads+adam": "learner", "lora+adam": "learner", "activations": "learner",
          "logits": "learner", "gen weights": "generator", "kv cache": "generator", "gen compute": "generator",
          "cuda context": "CUDA"}


def estimate(shape: ModelShape, setup: Setup) -> Estimate:
    """Peak memory of one node with this model and these settings (see the module doc)."""
    s, seq = shape, setup.prompt_tokens + setup.completion_tokens
    learner: dict = {"weights": 4 * s.n_params}
    if setup.trainable == "full":
        learner["grads+adam"] = 12 * s.n_params
    else:
        learner["lora+adam"] = 16 * _lora_params(s, setup.lora_targets, setup.lora_r)
    # a micro-batch runs each distinct prompt once (learner.share_prompts) and its completions on top
    prompts = max(1, -(-setup.micro_batch // max(setup.group, 1)))
    rows = prompts * setup.prompt_tokens + setup.micro_batch * setup.completion_tokens
    per_value = activation_bytes(setup.device, setup.train_precision)     # the learner's rule (precision.py)
    learner["activations"] = per_value * rows * s.n_layer * _activation_floats_per_token(s, setup.trainable)
    learner["logits"] = 4 * LOGIT_COPIES * min(LOGIT_CHUNK_ROWS, setup.micro_batch * setup.completion_tokens) * s.vocab
    gen = backend_class(setup.backend)
    generator = gen.memory(s, setup, setup.group * _round_up(seq, 64))
    ram, vram = {"runtime": RUNTIME_BYTES}, {}
    on_gpu = setup.device in ("cuda", "mps")
    if on_gpu and setup.device == "cuda":
        vram["cuda context"] = CUDA_CONTEXT_BYTES
    (vram if on_gpu and setup.device == "cuda" else ram).update(learner)
    (vram if gen.memory_on_learner_device and setup.device == "cuda" else ram).update(generator)
    return Estimate(ram, vram)


# ------------------------------------------------------------------ the machine

@dataclass(frozen=True)
class Machine:
    ram_total: int
    ram_available: int
    vram_total: int | None = None
    vram_free: int | None = None


def _meminfo() -> dict:
    out = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def machine(device: str = "cpu") -> Machine:
    """What this machine has: RAM from /proc/meminfo (sysconf elsewhere), the GPU's from torch on CUDA."""
    info = _meminfo()
    total = info.get("MemTotal")
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 0
    available = info.get("MemAvailable", total)
    vram_total = vram_free = None
    if device == "cuda":
        import torch
        if torch.cuda.is_available():
            vram_free, vram_total = torch.cuda.mem_get_info()
    return Machine(total, available, vram_total, vram_free)


# ------------------------------------------------------------------ the verdict

def advice(shape: ModelShape, setup: Setup, limit_ram: float, limit_vram: float | None) -> str:
    """The first change that makes it fit, tried in the order a user would (cheapest to the run first)."""
    def fits(st: Setup) -> bool:
        e = estimate(shape, st)
        return e.ram_bytes <= limit_ram and (limit_vram is None or e.vram_bytes <= limit_vram)

    tries = []
    if setup.trainable == "full":
        tries.append(("train.trainable = \"lora\"", replace(setup, trainable="lora")))
    mb = setup.micro_batch
    while mb > 1:
        mb //= 2
        tries.append((f"train.micro_batch = {mb}", replace(setup, micro_batch=mb)))
    quantizable = "quantized" in backend_class(setup.backend).weight_precisions
    if quantizable and setup.precision == "f16":
        tries.append(("model.precision = \"quantized\"", replace(setup, precision="quantized")))
    for change, st in tries:
        if fits(st):
            return change
    # then the lengths and the group (what a 2 TB need is usually made of), each halved with the
    # cheap changes above taken too, the fewest changes first
    cheap = replace(setup, trainable="lora", micro_batch=1,
                    precision="quantized" if quantizable else setup.precision)
    length, group = setup.completion_tokens, setup.group
    while length > MIN_COMPLETION or group > MIN_GROUP:
        if length > MIN_COMPLETION:
            length = max(MIN_COMPLETION, length // 2)
        if group > MIN_GROUP:
            group = max(MIN_GROUP, group // 2)
        for base in (setup, replace(setup, micro_batch=1), cheap):
            for st in (replace(base, completion_tokens=length), replace(base, group=group),
                       replace(base, completion_tokens=length, group=group)):
                if fits(st):
                    return _changes(setup, st)
    if fits(cheap):
        return _changes(setup, cheap)
    return "a smaller model (model.spec; see docs/models.md)"


MIN_COMPLETION, MIN_GROUP = 64, 2      # the smallest lengths and groups advice goes down to


def _changes(was: Setup, now: Setup) -> str:
    """The settings that differ between two setups, as config lines joined by "and"."""
    rows = (('train.trainable = "lora"', was.trainable != now.trainable),
            (f"train.micro_batch = {now.micro_batch}", was.micro_batch != now.micro_batch),
            ('model.precision = "quantized"', was.precision != now.precision),
            (f"task.max_completion_length = {now.completion_tokens}", was.completion_tokens != now.completion_tokens),
            (f"task.num_generations = {now.group}", was.group != now.group))
    return " and ".join(c for c, differs in rows if differs)


# What each part of the estimate grows with: named when a part dominates a need that does not fit.
DRIVERS = {
    "activations": lambda st: f"train.micro_batch {st.micro_batch} x (prompt {st.prompt_tokens} + "
                              f"task.max_completion_length {st.completion_tokens}) tokens",
    "logits": lambda st: f"train.micro_batch {st.micro_batch} x task.max_completion_length {st.completion_tokens} "
                         f"tokens x the vocabulary",
    "kv cache": lambda st: f"task.num_generations {st.group} x (prompt {st.prompt_tokens} + "
                           f"task.max_completion_length {st.completion_tokens}) tokens",
    "grads+adam": lambda st: 'train.trainable = "full"',
    "lora+adam": lambda st: f"train.lora_r {st.lora_r}",
    "weights": lambda st: "model.spec", "gen weights": lambda st: "model.spec and model.precision",
}
PART_NAMES = {"activations": "the learner's activations", "logits": "the learner's logits",
              "kv cache": "the generator's KV cache", "grads+adam": "gradients and Adam moments",
              "lora+adam": "LoRA adapters and their Adam moments", "weights": "the learner's weights",
              "gen weights": "the generator's weights"}


def dominant(est: Estimate, setup: Setup) -> str | None:
    """"most of it is the learner's activations (1900 GB: train.micro_batch 256 x ...)" for the
    largest part of the estimate, when a setting drives it."""
    parts = {**est.ram, **est.vram}
    part = max(parts, key=parts.get)
    if part not in DRIVERS:
        return None
    return f"most of it is {PART_NAMES[part]} ({parts[part] / GB:.0f} GB: {DRIVERS[part](setup)})"


def check(shape: ModelShape, setup: Setup, have: Machine) -> tuple[bool, str]:
    """(fits, one line): the estimate against what the machine has, and what to change if it does not fit."""
    est = estimate(shape, setup)
    limit_ram = HEADROOM * (have.ram_available or have.ram_total)
    limit_vram = HEADROOM * have.vram_free if (est.vram and have.vram_free) else None
    ok = est.ram_bytes <= limit_ram and (limit_vram is None or est.vram_bytes <= limit_vram)
    where = f"{have.ram_available / GB:.1f} GB RAM free"
    if limit_vram is not None:
        where += f", {have.vram_free / GB:.1f} GB GPU free"
    head = f"{shape.name} ({shape.n_params / 1e6:.0f}M, {setup.trainable}, {setup.backend}, {setup.device}): " \
           f"needs ~{est.line()}; {where}"
    if ok:
        return True, head
    why = dominant(est, setup)
    return False, f"{head} — does not fit" + (f"; {why}" if why else "") + \
        f"; try {advice(shape, setup, limit_ram, limit_vram)}"


def impossible(shape: ModelShape, setup: Setup, have: Machine) -> str | None:
    """Why no start can succeed (more than the machine has in all, not only free now), in one short
    line with what dominates and what to change; None when it could fit."""
    est = estimate(shape, setup)
    if have.ram_total and est.ram_bytes > have.ram_total:
        need = f"~{est.ram_bytes / GB:.0f} GB RAM, more than this machine's {have.ram_total / GB:.0f} GB in all"
    elif est.vram and have.vram_total and est.vram_bytes > have.vram_total:
        need = f"~{est.vram_bytes / GB:.0f} GB on the GPU, more than its {have.vram_total / GB:.0f} GB in all"
    else:
        return None
    why = dominant(est, setup)
    limit_vram = HEADROOM * have.vram_free if (est.vram and have.vram_free) else None
    return (f"{shape.name} needs {need} (not started); " + (f"{why}; " if why else "")
            + f"try {advice(shape, setup, HEADROOM * (have.ram_available or have.ram_total), limit_vram)}")


# ------------------------------------------------------------------ which model on which machine

# Published shapes (the models' config.json, all with tied embeddings); n_params follows from them.
_SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size")
KNOWN_SHAPES = {name: dict(zip(_SHAPE_KEYS, row), tie_word_embeddings=True) for name, row in {
    "SmolLM2-135M": (576, 1536, 30, 9, 3, 64, 49152),
    "Gemma-3-270M": (640, 2048, 18, 4, 1, 256, 262144),
    "Qwen2.5-0.5B": (896, 4864, 24, 14, 2, 64, 151936),
    "Llama-3.2-1B": (2048, 8192, 16, 32, 8, 64, 128256),
    "Qwen2.5-1.5B": (1536, 8960, 28, 12, 2, 128, 151936),
    "Llama-3.2-3B": (3072, 8192, 28, 24, 8, 128, 128256),
    "Qwen2.5-3B": (2048, 11008, 36, 16, 2, 128, 151936),
}.items()}

MACHINES = (("8 GB laptop", 8), ("16 GB PC", 16), ("32 GB PC", 32), ("64 GB PC", 64))


def models_table(setup: Setup = Setup()) -> str:
    """Markdown: each known model's estimate (LoRA and full fine-tuning, learner on the CPU) and the
    smallest machine it fits (the estimate within HEADROOM of the ~75% of RAM a desktop leaves free)."""
    def smallest(need: int) -> str:
        return next((m for m, gb in MACHINES if need <= HEADROOM * 0.75 * gb * GB), "more than 64 GB")

    # the GPU column: the backend that samples from the learner's own weights (no second copy)
    live = next(n for n in BACKENDS if not backend_class(n).loads_weight_files)
    rows = ["| model | parameters | LoRA: RAM | full: RAM | LoRA runs on | full runs on | full on a GPU: VRAM |",
            "|---|---|---|---|---|---|---|"]
    for name, cfg in KNOWN_SHAPES.items():
        shape = shape_from_hf_config(cfg, name)
        lora = estimate(shape, replace(setup, trainable="lora")).ram_bytes
        full = estimate(shape, replace(setup, trainable="full")).ram_bytes
        gpu = estimate(shape, replace(setup, trainable="full", device="cuda", backend=live)).vram_bytes
        rows.append(f"| {name} | {shape.n_params / 1e9:.2f} B | {lora / GB:.1f} GB | {full / GB:.1f} GB | "
                    f"{smallest(lora)} | {smallest(full)} | {gpu / GB:.1f} GB |")
    return "\n".join(rows)


def render_models_doc() -> str:
    """docs/models.md (docs/make_docs.py writes it; tests check it is current)."""
    s = Setup()
    return f"""# Which model on which machine

Generated by `docs/make_docs.py` from `ftis_edge/learn/fit.py`, the estimator a node runs before it loads
anything (the line `memory: ...` in node.log; `ftis-edge init` prints it for the file it writes).
Checked against the measured peak RSS of real nodes by `benchmarks/bench_fit.py` (docs/benchmarks.md).

Default settings: G = {s.group}, {s.completion_tokens} new tokens, a {s.prompt_tokens}-token prompt,
micro-batch {s.micro_batch}, LoRA r = {s.lora_r} on q/k/v/o; learner on the CPU, llama.cpp generator
with F16 weights. "runs on" is the smallest of 8 / 16 / 32 / 64 GB whose free memory (~75% of it on a
desktop with a browser open) holds the estimate with 10% to spare. The last column is full
fine-tuning with the learner on a CUDA GPU (`model.backend = "hf"` samples from the same weights).

{models_table(s)}

What moves the numbers, biggest first:

* **Activations** grow with `train.micro_batch` x (prompt + `task.max_completion_length`) x layers:
  halving the micro-batch halves them (the node also halves it by itself after an out-of-memory error).
* **Full fine-tuning** adds 12 bytes per parameter (gradients + Adam); LoRA adds almost nothing.
* **The vocabulary**: one chunk of logits is 1024 rows x vocabulary x 4 bytes x 3 (Gemma 3: 262k words, 3 GB).
* **The generator's weights**: `model.precision = "quantized"` loads the shipped GGUF (Q4/Q8) instead of
  the F16 re-export.

When a node's estimate does not fit, it says so in one line at start-up with the part that dominates
and the first change that fits (LoRA instead of full, a smaller micro-batch, the quantized generator,
shorter completions, smaller groups, a smaller model); a need beyond all the machine's memory is refused.
"""


def summary(cfg) -> str:
    """What ``ftis-edge init`` prints: the file's model on this machine (CPU; a GPU is checked at start)."""
    from ..models.resolve import ModelError, resolve_model
    try:
        shape = shape_of(resolve_model(cfg.model.spec), cfg.model_label)
    except (ModelError, OSError, KeyError, ValueError) as e:      # a model not here yet: estimated at start
        return f"memory: estimated when the node starts ({e})"
    _, line = check(shape, Setup.from_config(cfg), machine())
    return f"memory: {line}\n        other models and machines: docs/models.md"
