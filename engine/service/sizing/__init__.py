"""A session sized before it is queued: its plan counted, its time estimated, a time budget, the default engine."""
