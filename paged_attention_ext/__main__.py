"""`python -m paged_attention_ext ...` (the same as the `paged-attn` command)."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
