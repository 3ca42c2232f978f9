"""The buyer server: search, carts, purchases, feedback and history over TCP."""
