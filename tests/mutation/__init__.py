"""``make mutation``: the score per module of a ``mutmut run`` (see ``[tool.mutmut]`` in pyproject.toml)."""
