"""``python -m tracegrad``: the command line (see tracegrad/cli.py)."""
import sys

from tracegrad.cli import main

sys.exit(main())
