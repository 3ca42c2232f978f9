"""The `market` command: interactive buyer and seller shells, `serve`, `health` and `seed`."""
