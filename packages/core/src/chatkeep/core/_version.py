"""The chatkeep-core release this source tree is (the installed distribution's metadata wins)."""

__version__ = "0.1.0"
