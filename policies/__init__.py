"""The policy: readings in, assessments and decisions out; no I/O."""
