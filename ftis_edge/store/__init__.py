"""What a run keeps on disk: the run directory, its lock, checkpoints and state files,
progress.json, what a resume may change, room on the disk."""
