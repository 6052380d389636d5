"""llama.cpp as a session engine: the installed llama-server, the processes we manage, and its HTTP client."""
