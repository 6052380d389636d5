"""Measurements: step statistics, verify cost v(k), agreement runs, fidelity, telemetry, hardware, micro-benchmarks."""
