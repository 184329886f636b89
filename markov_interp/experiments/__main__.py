import sys

from markov_interp.experiments import main

if __name__ == "__main__":
    sys.exit(main())
