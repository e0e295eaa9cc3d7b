"""ClientApp: SuperNode ``partition-id`` = push-sum node id (see flower_dp.clients.push_sum_app).

:mod:`flower_dp.clients.push_sum_app` does not import torch: on Flower's deployment engine a fresh
``flwr-clientapp`` process imports this module for every message and hands the message to a persistent node
process of its SuperNode.
"""

from flower_dp.clients import make_client_app

app = make_client_app()
