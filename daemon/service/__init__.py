"""The running process: sources, state, the policy loop, supervision, systemd."""
