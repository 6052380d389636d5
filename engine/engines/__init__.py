"""Session engines: each a Runner plug-in (spectune's loop, llama.cpp, …) registered once in registry.py."""
