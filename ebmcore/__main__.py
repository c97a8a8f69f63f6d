"""``python -m ebmcore``: the ``ebm`` command, for environments whose scripts directory is not on ``PATH``."""

import sys

from ebmcore.cli import main

if __name__ == "__main__":
    sys.exit(main())
