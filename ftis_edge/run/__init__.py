"""The run: a node's parts assembled, one round after another, the held-out eval and the guard,
weight sync to the generator, start-up checks, devices, and the node's log."""
