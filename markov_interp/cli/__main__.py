"""`python -m markov_interp.cli`: the command line (`markov_interp.cli.main`)."""

import sys

from markov_interp.cli import main

if __name__ == "__main__":  # importing this module (the import checks walk every module) runs nothing
    sys.exit(main())
