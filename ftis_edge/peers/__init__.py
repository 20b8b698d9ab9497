"""What a node takes from and gives to its peers: the door to the relay, intake (checks,
re-grading, selection), what each kind of peer is worth, outcomes, plausibility."""
