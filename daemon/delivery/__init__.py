"""Getting decisions to the scheduler: the durable outbox, the sinks, reconciliation."""
