"""Offline work for the learned routers: labelling which model suffices for each token of a
reference corpus (teacher forcing), and training a router on those labels. Nothing here runs at
serving time; the policies load what it writes (`policies/routers.py`)."""
