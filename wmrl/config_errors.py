"""A config error that names the offending field."""


class ConfigError(ValueError):
    """Raised for invalid configs; the message starts with the full field name."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")
