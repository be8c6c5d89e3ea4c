"""tokenyard: the control plane of an LLM serving fleet (see README.md and docs/ARCHITECTURE.md)."""

__version__ = "0.1.0"
