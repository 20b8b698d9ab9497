"""ftis-relay: the self-hosted ZeroMQ relay nodes publish rollouts through (docs/relay.md)."""
