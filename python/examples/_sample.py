"""What the examples share: the data they read, named on the command line or made for them."""
import atexit
import os
import sys
import tempfile


def path_or_sample(name, make):
    """The command line's first argument, or `name` in a temporary directory (removed when the
    program ends) written by `make(path)` first."""
    if len(sys.argv) > 1:
        return sys.argv[1]
    tmp = tempfile.TemporaryDirectory()
    atexit.register(tmp.cleanup)
    path = os.path.join(tmp.name, name)
    make(path)
    return path
