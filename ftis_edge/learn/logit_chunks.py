"""The learner's logits, a chunk of rows at a time: the sizes the learner computes with and the
memory estimate (fit.py) counts, kept here (no torch) so that neither has to import the other.

A [tokens, vocab] logits tensor is the learner's largest (Gemma 3: 262k words), so the learner
materialises ``LOGIT_CHUNK_ROWS`` rows of it at once (head_logprob.py: a frozen head's gradient
is computed in the forward from the logits it already has; a trained head recomputes them once).
"""

LOGIT_CHUNK_ROWS = 1024            # rows of [tokens, vocab] logits the learner materialises at once
LOGIT_COPIES = 3                   # logits (exp'd in place), a softcap's tanh or the entropy's probabilities, a temporary
