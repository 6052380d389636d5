"""What every layer shares and nothing else: the user-facing error base and where spectune keeps files."""
