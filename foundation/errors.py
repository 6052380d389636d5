"""SpectuneError: the base of every error a user can fix, shown as one clear line, never a traceback."""


class SpectuneError(Exception):
    """A problem the user can fix (bad argument, missing file, unknown model, unusable database)."""
