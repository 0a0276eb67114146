"""`python -m scripts.gpu_kit COMMAND`: the kit's command line (cli.py), run from the repository root."""

import sys

from .cli import main

sys.exit(main())
