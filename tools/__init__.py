"""Repository tooling, run from the checkout (`python -m tools.NAME`); not part of the installed package."""
