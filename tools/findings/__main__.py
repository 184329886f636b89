import sys

from tools.findings import main

if __name__ == "__main__":
    sys.exit(main())
