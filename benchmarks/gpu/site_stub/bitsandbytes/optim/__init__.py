"""See bitsandbytes/__init__.py: an import-time stand-in."""
