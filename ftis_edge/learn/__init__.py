"""Learning: the F-TIS objective (a pure function), the batch a round trains on, the learner,
the LM head's log-probs, the shared prompt, and whether a model fits in memory."""
