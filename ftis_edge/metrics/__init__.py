"""What a round records and reports: the round record and its keys, CPU-seconds, what "best"
means, and the statistics the evals and experiments print."""
