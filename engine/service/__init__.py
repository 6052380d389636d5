"""The process boundary: worker, job queue, CLI, and the only code in engine/ that touches the store."""
