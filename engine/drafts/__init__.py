"""Draft sources behind the DraftSource interface, one per file, and the factory that builds one from a reference."""
