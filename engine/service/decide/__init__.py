"""From stored sessions to the one decision: evidence, recommendations, policy replay and the speedup surface."""
