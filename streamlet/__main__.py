"""``python -m streamlet``: the same as the ``streamlet`` command."""

from streamlet.cli import main

main()
