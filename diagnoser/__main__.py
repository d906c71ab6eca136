"""``python -m diagnoser`` is the ``diagnose`` command."""

from diagnoser.cli import main

main()
