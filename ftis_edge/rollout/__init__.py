"""A rollout as it leaves the generator and travels: token bytes and their alignment across
tokenizers, the training sample, and the wire format peers exchange."""
