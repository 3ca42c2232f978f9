"""The server runtime: what turns the protocol (`wire`) and the data layer (`db`) into a
running server process.

`config` reads every setting (flags, environment, `.env`), `runner` starts a server and
supervises the workers of `--workers N`, `health` is the supervisor's checks of its workers,
and `cached_app` puts the catalogue read cache in front of a server's handlers.
"""
