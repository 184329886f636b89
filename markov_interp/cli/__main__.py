"""`python -m markov_interp.cli`: the command line (`markov_interp.cli.main`)."""

import sys

from markov_interp.cli import main

sys.exit(main())
