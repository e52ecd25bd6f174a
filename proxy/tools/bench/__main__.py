"""``python -m proxy.tools.bench``: the bench's own processes (its Agent, its relays) and the
bench."""

import sys

from proxy.tools.bench import main

sys.exit(main())
