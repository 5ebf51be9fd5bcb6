"""``goodput model build-tiny [DIR] [--seed N]``: build (or find cached) the tiny local model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from serving.model.tiny import ModelBuildError, TinyModelSpec, build_tiny_model, default_model_dir

__all__ = ["model_app", "register"]

model_app = typer.Typer(help="The tiny local model vLLM serves here.", no_args_is_help=True)


@model_app.command("build-tiny")
def build_tiny(
    directory: Annotated[
        Path | None, typer.Argument(help="target folder; default var/models/tiny-llama")
    ] = None,
    seed: Annotated[int, typer.Option(help="weight seed (same seed, same bytes)")] = 0,
) -> None:
    """Build a random-weight Llama and its tokenizer (≈5 s; returns at once if cached).
    Prints the folder on stdout."""
    target = directory or default_model_dir()
    try:
        built = build_tiny_model(target, TinyModelSpec(seed=seed))
    except ModelBuildError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    typer.echo(str(built.resolve()))


def register(app: typer.Typer) -> None:
    """Add ``goodput model ...`` to ``app``."""
    app.add_typer(model_app, name="model")
