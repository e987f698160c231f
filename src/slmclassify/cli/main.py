"""The `slmclassify` command group and its entry point. Library errors become one-line messages
and exit code 2; an error about a library field names the flag that set it (`options.flag_of`).
The commands live in one module per group: classify (classify, verify), batch, evaluate (evaluate,
fit), bench (bench, sweep, loadtest), serve (serve, tokenizer), label."""

from __future__ import annotations

import sys

import click

from ..errors import SlmClassifyError, VerificationError
from . import batch, bench, classify, evaluate, label, serve
from .options import flag_error
from .startup import start_torch


def main() -> None:
    """Console-script entry point."""
    from ..interrupts import NOTHING_WRITTEN, Interrupted, handle_sigterm, terminate_as_interrupt

    handle_sigterm()
    _one_line_cache_warnings()
    try:
        cli.main(standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo(NOTHING_WRITTEN, err=True)
        sys.exit(143 if terminate_as_interrupt.received else 130)
    except Interrupted as exc:
        click.echo(f"slmclassify: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except VerificationError as exc:
        click.echo(f"slmclassify: {exc}", err=True)
        sys.exit(1)
    except SlmClassifyError as exc:
        click.echo(f"slmclassify: error: {exc}", err=True)
        sys.exit(2)


def _one_line_cache_warnings() -> None:
    """A cache that cannot be written (`cache.CacheWarning`) is one line on stderr, not Python's two."""
    import warnings

    from ..cache import CacheWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, CacheWarning):
            click.echo(f"slmclassify: warning: {message}", err=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


class _Commands(click.Group):
    """The command group: a library error that names fields is re-raised naming the flags instead."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SlmClassifyError as exc:
            if exc.template is None:
                raise
            raise flag_error(exc) from None


@click.group(cls=_Commands)
@click.version_option(package_name="slmclassify")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Label texts with a small local language model: constrained scoring, a prefix KV cache
    and length-bucketed batching, checked against the per-item path."""
    if ctx.invoked_subcommand != "classify":  # classify starts torch itself unless it runs on Ray
        start_torch()


for _command in (classify.classify, classify.verify, batch.batch, evaluate.evaluate, evaluate.fit, bench.bench,
                 bench.sweep, bench.loadtest, serve.serve, serve.tokenizer, label.label):
    cli.add_command(_command)
