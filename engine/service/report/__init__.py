"""The shareable report of a session and the words every reader uses for how it measured and how it ended."""
