"""Where a model's turn ends, spelled once: end-of-turn control tokens and the plain format's next turn.

* ``END_OF_TURN_TEXTS``: control tokens llama.cpp treats as end-of-generation. gguf_io adds them
  to a GGUF's eos ids when its metadata names only one (SmolLM2: ``<|im_end|>`` is eos,
  ``<|endoftext|>`` also ends a sequence).
* ``PLAIN_TURN_STOP``: a base model prompted in the plain format (models.py, no chat template)
  has no such token; it starts the next ``User:`` turn itself, and the generator stops there
  (generate/stops.py, ModelBundle.stop_texts; export's plain Modelfile stops there too).
* ``END_MARKERS``: what a completion's text may end with, stripped before grading (tasks/rewards.py).
"""
from __future__ import annotations

END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<eos>", "</s>")
PLAIN_TURN_STOP = "\nUser:"
END_MARKERS = END_OF_TURN_TEXTS + (PLAIN_TURN_STOP,)
