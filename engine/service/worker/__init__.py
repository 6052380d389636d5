"""The decoding worker: its loop and control, the store hooks a sweep writes through, the quick and full sweeps."""
