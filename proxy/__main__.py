"""``python -m proxy``: the same program as the ``acp-proxy`` console script."""

from proxy.cli import main

main()
