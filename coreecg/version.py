"""coreecg's version, in a module of its own so that any part of the package (the data
pipeline in particular) can read it without importing the package's other modules."""
from __future__ import annotations

__version__ = "0.1.0"
