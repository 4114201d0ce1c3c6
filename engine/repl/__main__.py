"""`python -m engine.repl`: see `engine.repl.cli`."""

import sys

from engine.repl.cli import main

sys.exit(main())
