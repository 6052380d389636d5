"""Watch a running deployment: its speculation counters per window, and whether speculation still pays."""
