"""The command line, `python -m engine …`: argparse and printing over the service, a module per command group."""
