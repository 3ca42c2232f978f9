"""The server runtime: what turns the protocol (`wire`) and the data layer (`db`) into a
running server process.

`server` is the loop both servers share (its leader's side in `reader`, whose turn it is in
`scheduler`), `connection` a client's state, `admission` who may connect, `flow` the bytes
held unanswered, `tls` TLS over memory buffers, `signals` what signals do; `config` reads
every setting, `runner` starts a server, `supervisor` and `health` run the workers of
`--workers N`.
"""
