"""`python -m whale.cli`: the `whale` command."""

from whale.cli import main

main()
