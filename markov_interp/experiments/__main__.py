import sys

from markov_interp.experiments import main

sys.exit(main())
