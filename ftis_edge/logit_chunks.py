"""The learner's logits, a chunk of rows at a time: the sizes the learner computes with and the
memory estimate (fit.py) counts, kept here (no torch) so that neither has to import the other.

A [tokens, vocab] logits tensor is the learner's largest (Gemma 3: 262k words), so
``Learner._token_logprobs`` materialises ``LOGIT_CHUNK_ROWS`` rows of it at once, under
activation checkpointing, in the forward and the backward pass.
"""

LOGIT_CHUNK_ROWS = 1024            # rows of [tokens, vocab] logits the learner materialises at once
LOGIT_COPIES = 3                   # logits, their exp for logsumexp, the gradient (recomputed per chunk)
