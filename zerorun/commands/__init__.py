"""One module per CLI subcommand; each exposes ``command`` (a typer callback)."""
