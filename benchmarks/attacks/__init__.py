"""Attacks on a real relay or a real learner: each measures what an attacker gets, defended and not."""
