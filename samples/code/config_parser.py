"""A tiny parser for INI-style configuration files.

Example input::

    # comments start with '#' or ';'
    [server]
    host = 127.0.0.1
    port = 8080
    debug = yes

    [paths]
    data = ~/data
"""

import os

TRUE_WORDS = {"1", "yes", "true", "on"}
FALSE_WORDS = {"0", "no", "false", "off"}


class ConfigError(Exception):
    """Raised when a configuration file cannot be parsed."""

    def __init__(self, message, line_no):
        super().__init__(f"line {line_no}: {message}")
        self.line_no = line_no


def convert(value):
    """Convert a raw string to bool, int, float or str."""
    lowered = value.lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    if value.startswith("~"):
        return os.path.expanduser(value)
    return value


def parse(text):
    """Parse configuration text into a dict of sections."""
    config = {}
    section = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            if not section:
                raise ConfigError("empty section name", line_no)
            config.setdefault(section, {})
            continue
        if "=" not in line:
            raise ConfigError(f"expected 'key = value', got {line!r}", line_no)
        if section is None:
            raise ConfigError("key found before any section", line_no)
        key, _, value = line.partition("=")
        config[section][key.strip()] = convert(value.strip())
    return config


def load(path):
    """Read and parse the configuration file at `path`."""
    with open(path, encoding="utf-8") as handle:
        return parse(handle.read())


def get(config, dotted_key, default=None):
    """Look up 'section.key' in a parsed config, returning `default` if absent."""
    section, _, key = dotted_key.partition(".")
    return config.get(section, {}).get(key, default)


if __name__ == "__main__":
    import sys

    for name, values in load(sys.argv[1]).items():
        print(f"[{name}]")
        for key, value in values.items():
            print(f"  {key} = {value!r}")
