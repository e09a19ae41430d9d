"""Run a command as on an install without some packages: `python tests/installs_hide.py PKG,PKG MODULE ARGS...`.
Imports of the hidden packages fail as for a package that is not installed, and importlib.util.find_spec (what
ner.extras and the runtime registry ask) answers None for them. Used by tests/test_installs.py."""

import importlib.abc
import importlib.util
import sys

hidden = set(filter(None, sys.argv[1].split(",")))


class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Hidden())
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (None if name.partition(".")[0] in hidden
                                                       else find_spec(name, package))
module = __import__(sys.argv[2], fromlist=["main"])
sys.exit(module.main(sys.argv[3:]))
