"""The server runtime: what turns the protocol (`wire`) and the data layer (`db`) into a
running server process (the loop, admission, guards, settings and the workers)."""
