"""spectune's own PyTorch loop as an engine: its runner, the loop it picks per machine, and its options."""
