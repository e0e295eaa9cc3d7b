"""Gau-LRQ example Flower app (flower-dp)."""
