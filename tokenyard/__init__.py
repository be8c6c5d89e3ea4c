"""tokenyard: the control plane of an LLM serving fleet (see README.md and DESIGN.md)."""

__version__ = "0.1.0"
