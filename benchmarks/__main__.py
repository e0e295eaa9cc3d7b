"""``python -m benchmarks``: run the flower-dp benchmark suite (see :mod:`benchmarks`)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
