"""The `market` command: interactive buyer and seller shells, `serve` and `health`."""
