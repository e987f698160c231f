"""The command line: the only part of slmclassify that imports click or prints. Library code
raises; `main` turns errors into one line and an exit code."""

from .main import cli, main

__all__ = ["cli", "main"]
