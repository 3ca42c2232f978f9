"""Studies of the marketplace: each one command (python -m simulation.studies.NAME) that starts
the servers for every configuration, drives them with the simulator, and writes a table and a
plot. docs/studies.md says what each measures and what it found."""
