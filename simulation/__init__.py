"""Load for the marketplace: a barrier-synchronised simulator (`market-sim`) and a
locust file, both driving the real servers over the wire protocol and both using
the same simulated buyers and sellers (`behaviour`).
"""
