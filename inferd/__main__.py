import sys

from inferd.cli import main

# NOTE: the guard matters: tensor-parallel workers are spawned processes that import __main__.
if __name__ == "__main__":
    sys.exit(main())
