"""The `lookahead` command line (click); entry point lookahead.cli.main:main."""
