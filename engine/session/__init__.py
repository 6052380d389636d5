"""One tuning session: its spec (validated once) and the sweep that runs it."""
