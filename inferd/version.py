"""inferd's version, in a module of its own: everything inside inferd may import it, while the
package root (`inferd/__init__.py`) re-exports the public API from the top of the import graph."""

from __future__ import annotations

__version__ = "0.1.0"
