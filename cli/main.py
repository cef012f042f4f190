"""The `lookahead` command: generate text or rewrite a file with exact speculative decoding."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import click

from lookahead.adapters.llama_cpp import rpc
from lookahead.sampling import FRONT_END_DEFAULTS as DEFAULTS

from .options import EXIT_INTERRUPTED, load_wrapped, model_options


def _sampling_options(f):
    options = [
        click.option("--temperature", "-t", type=click.FloatRange(min=0.0), default=DEFAULTS.temperature,
                         show_default=True, help="0 = greedy (deterministic). Higher = more random."),
        click.option("--top-k", type=click.IntRange(min=0), default=DEFAULTS.top_k, show_default=True,
                         help="Sample among the k most likely tokens (0 = all)."),
        click.option("--top-p", type=click.FloatRange(0.0, 1.0), default=DEFAULTS.top_p, show_default=True,
                         help="Nucleus sampling: smallest set with this much probability."),
        click.option("--min-p", type=click.FloatRange(0.0, 1.0), default=DEFAULTS.min_p, show_default=True,
                         help="Drop tokens below min-p times the top token's probability."),
        click.option("--repeat-penalty", type=click.FloatRange(min=0.0, min_open=True),
                         default=DEFAULTS.repeat_penalty, show_default=True,
                         help="Penalty for tokens among the last 64 generated (1 = off)."),
        click.option("--seed", type=int, default=None, help="Random seed for sampling (reproducible runs)."),
        click.option("--max-tokens", type=click.IntRange(min=1), default=None,
                         help="Most tokens to generate. Default: generate: 512; rewrite: no total limit "
                              "(each part of the text is bounded at 1.3x its length + 32 tokens)."),
        click.option("--stop", multiple=True, help="Stop when this string appears (repeatable)."),
        click.option("--no-speculate", is_flag=True,
                         help="Plain decoding through the same engine (the reference for speed and output)."),
        click.option("--max-draft", type=click.IntRange(min=1, max=256), default=64, show_default=True,
                         help="Longest draft the cost model may choose."),
        click.option("--stats", "show_stats", is_flag=True, help="Print speculation stats to stderr."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text + stats) instead of text."),
    ]
    for option in reversed(options):  # decorators apply bottom-up; keep --help in this order
        f = option(f)
    return f


def _sampling_kwargs(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop) -> dict[str, Any]:
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                repeat_penalty=repeat_penalty, seed=seed, stop=list(stop))


def read_text_file(path: Path) -> str:
    """Read a UTF-8 text file, or raise click.BadParameter saying why it is not one."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise click.BadParameter(f"cannot read {str(path)!r}: {e.strerror}") from None
    if b"\x00" in data[:65536]:
        raise click.BadParameter(f"{str(path)!r} looks binary (it contains NUL bytes); lookahead edits text files only")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise click.BadParameter(
            f"{str(path)!r} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "convert it to UTF-8 first"
        ) from None


def _print_stats(stats: dict | None) -> None:
    if not stats:
        return
    from lookahead.stats import SpeculationStats

    click.echo(SpeculationStats.from_dict(stats).summary(), err=True)


class _Progress:
    """A one-line progress report on stderr while output goes to a file."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.chars = 0
        self._last = 0.0

    def update(self, text: str) -> None:
        self.chars += len(text)
        now = time.perf_counter()
        if self.enabled and now - self._last > 0.2:
            self._last = now
            click.echo(f"\r  {self.chars} chars, {now - self.t0:.1f} s", nl=False, err=True)

    def done(self) -> None:
        if self.enabled:
            click.echo("\r" + " " * 40 + "\r", nl=False, err=True)


# ---- commands -----------------------------------------------------------------------------
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lookahead")
def main() -> None:
    """Exact prompt-lookup speculative decoding for local llama.cpp models.

    A suffix index over the prompt, the output so far and any reference text proposes the
    tokens that followed the current suffix before; the model checks the whole guess in one
    pass and keeps exactly what its own sampling would have produced: output is distributed as
    plain decoding's, and only the speed changes. On the set-up's llama.cpp build batched and
    one-token decodes compute the same, bit for bit (exact mode, on by default; --no-exact
    turns it off), so greedy text is plain decoding's token for token.

    \b
    Examples:
      lookahead rewrite notes.md -i "Fix the typos" --in-place --stats
      lookahead generate "Write a haiku about autumn" --max-tokens 64
      echo "Summarise: ..." | lookahead generate - --json
    """


@main.command()
@click.argument("prompt", required=False)
@click.option("--file", "prompt_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read the prompt from a UTF-8 file.")
@click.option("--mode", type=click.Choice(["auto", "chat", "raw"]), default="auto", show_default=True,
              help="chat: wrap the prompt in the model's chat template; raw: complete the text as is; "
                   "auto: chat when the model has a template.")
@click.option("--system", default=None, help="System message (chat mode).")
@click.option("--reference", "references", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="A text file whose passages the output may copy (repeatable).")
@_sampling_options
@model_options()
def generate(prompt, prompt_file, mode, system, references, temperature, top_k, top_p, min_p, repeat_penalty,
             seed, max_tokens, stop, no_speculate, max_draft, show_stats, as_json, model_path, n_ctx, threads,
             gpu_layers, tree_width):
    """Generate text from PROMPT (an argument, --file FILE, or - / nothing for stdin).

    The text streams to stdout as it is produced; --json prints one object at the end.
    """
    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give the prompt as an argument or with --file, not both")
    if prompt_file is not None:
        prompt = read_text_file(prompt_file)
    elif prompt is None or prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise click.UsageError("no prompt: pass PROMPT, --file FILE, or pipe text to stdin")
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="PROMPT")
    ref_texts = [read_text_file(p) for p in references]
    fast = load_wrapped(model_path, n_ctx, threads, gpu_layers, tree_width,
                        max_draft=max_draft, speculate=not no_speculate)
    if mode == "auto":
        mode = "chat" if fast.has_chat_template else "raw"
    kwargs = _sampling_kwargs(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop)
    kwargs.update(max_tokens=max_tokens or 512, references=ref_texts, stream=True)
    try:
        if mode == "chat":
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}]
            chunks = (_chat_delta(c) for c in fast.create_chat_completion(messages, **kwargs))
        else:
            chunks = (_completion_delta(c) for c in fast.create_completion(prompt, **kwargs))
        text, stats, finish = _consume(chunks, echo=not as_json)
    except (ValueError, rpc.RpcError) as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if as_json:
        click.echo(json.dumps({"text": text, "finish_reason": finish, "speculation": stats}, ensure_ascii=False))
    else:
        click.echo("")
    if show_stats:
        _print_stats(stats)


def _completion_delta(chunk: dict) -> tuple[str, str | None, dict | None]:
    choice = chunk["choices"][0]
    return choice.get("text", ""), choice.get("finish_reason"), chunk.get("speculation")


def _chat_delta(chunk: dict) -> tuple[str, str | None, dict | None]:
    choice = chunk["choices"][0]
    return choice.get("delta", {}).get("content") or "", choice.get("finish_reason"), chunk.get("speculation")


def _consume(chunks: Iterator[tuple[str, str | None, dict | None]], echo: bool, sink=None):
    parts: list[str] = []
    stats = finish = None
    for text, fin, spec in chunks:
        if text:
            parts.append(text)
            if echo:
                click.echo(text, nl=False)
            if sink is not None:
                sink(text)
        finish = fin or finish
        stats = spec or stats
    return "".join(parts), stats, finish


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--instruction", "-i", required=True, help='What to change, e.g. "Fix the typos".')
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the result here (atomically, once complete). Default: stream to stdout.")
@click.option("--in-place", is_flag=True, help="Replace FILE with the result (atomically, once complete).")
@click.option("--force", is_flag=True,
              help="Write --output / --in-place even when the answer diverged (kept under a quarter of "
                   "FILE's lines and was cut short by a loop or its bound, or came out under half FILE's "
                   "length); without it nothing is written then.")
@_sampling_options
@model_options()
def rewrite(file, instruction, output, in_place, force, temperature, top_k, top_p, min_p, repeat_penalty, seed,
            max_tokens, stop, no_speculate, max_draft, show_stats, as_json, model_path, n_ctx, threads, gpu_layers,
            tree_width):
    """Rewrite FILE following --instruction, with FILE registered as the reference to copy from.

    The result streams to stdout, or goes to --output / --in-place. A file being written is
    left untouched until the new text is complete; then it is replaced atomically, so Ctrl-C
    or an error never leaves a half-written file. The output is bounded by the input's
    length and a loop of repeated lines is stopped (with a warning on stderr). A file longer
    than the context is rewritten in parts cut at headings, paragraphs or top-level
    definitions, streamed in order. An answer that ends before the end of FILE, having copied
    FILE up to there, goes on with FILE's own text (with a warning). An answer that diverged
    from FILE (keeping under a quarter of its lines, and cut short by a loop or its length
    bound or under half its length: the model answered with something other than a rewrite)
    is not written without --force; exit code 1.
    """
    from lookahead import edit

    if output is not None and in_place:
        raise click.UsageError("use --output FILE or --in-place, not both")
    if not instruction.strip():
        raise click.BadParameter("the instruction is empty", param_hint="--instruction")
    text = read_text_file(file)
    destination = file if in_place else output
    fast = load_wrapped(model_path, n_ctx, threads, gpu_layers, tree_width,
                        max_draft=max_draft, speculate=not no_speculate)
    kwargs = _sampling_kwargs(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop)
    progress = _Progress(enabled=destination is not None and not as_json)
    echo = destination is None and not as_json

    def on_piece(index: int, count: int, span: tuple[int, int]) -> None:
        if count > 1:  # a long text, rewritten in parts: say which one is under way
            progress.done()
            click.echo(f"  part {index + 1}/{count} (characters {span[0]}-{span[1]} of {len(text)})", err=True)

    try:
        rw = edit.rewrite(fast, text, instruction, filename=file.name, max_tokens=max_tokens, on_piece=on_piece,
                          **kwargs)
    except (ValueError, rpc.RpcError) as e:
        raise click.ClickException(str(e)) from None
    n_doc = fast.count_tokens(text)
    parts = f", {len(rw.plan)} parts" if len(rw.plan) > 1 else ""
    try:  # from the announcement on, Ctrl-C is an interrupted rewrite (exit 130, file untouched)
        click.echo(f"rewriting {file} ({n_doc} tokens{parts}) with {Path(fast.model_path or fast.model_name).name}"
                   f"{'' if destination is None else f' -> {destination}'}", err=True)
        for piece in rw:
            if echo:
                click.echo(piece, nl=False)
            progress.update(piece)
        progress.done()
        result = rw.result
        refused = destination is not None and result.diverged and not force
        if destination is not None and not refused:
            write_atomic(destination, result.text)
    except ValueError as e:
        progress.done()
        raise click.ClickException(str(e)) from None
    except rpc.RpcError as e:  # a server lost mid-rewrite
        progress.done()
        raise click.ClickException(f"{e}{'' if destination is None else f'; {destination} left untouched'}") from None
    except KeyboardInterrupt:
        rw.close()
        progress.done()
        where = f"; {destination} left untouched" if destination is not None else ""
        click.echo(f"\ninterrupted{where}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if as_json:
        click.echo(json.dumps({"text": result.text, "finish_reason": result.finish_reason,
                               "output": str(destination) if destination and not refused else None,
                               "warnings": result.warnings, "parts": len(result.pieces),
                               "lines_kept": round(result.lines_kept, 3),
                               "length_ratio": round(result.length_ratio, 3), "diverged": result.diverged,
                               "speculation": result.speculation}, ensure_ascii=False))
    elif destination is None and not result.text.endswith("\n"):
        click.echo("")
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if show_stats:
        _print_stats(result.speculation)
    if refused:
        raise click.ClickException(
            f"not written: the answer diverged from {file} (finish: {result.finish_reason}, "
            f"{result.lines_kept:.0%} of its lines kept, {result.length_ratio:.2f}x its length); "
            f"{destination} is untouched. --force writes it anyway.")
    if destination is not None:
        click.echo(f"wrote {destination} ({len(result.text)} chars, finish: {result.finish_reason})", err=True)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".lookahead-tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


from lookahead.cli.bench import bench  # noqa: E402  (after `main` exists: bench is one of its commands)
from lookahead.cli.doctor import doctor  # noqa: E402
from lookahead.cli.models import models  # noqa: E402

main.add_command(bench)
main.add_command(doctor)
main.add_command(models)
from lookahead.server.cli import serve  # noqa: E402  (the OpenAI-compatible server; needs the [server] extra to run)
main.add_command(serve)


if __name__ == "__main__":  # pragma: no cover
    main()
