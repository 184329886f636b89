import sys

from markov_interp.findings import main

if __name__ == "__main__":
    sys.exit(main())
