"""ClientApp: SuperNode ``partition-id`` = push-sum node id (see flower_dp.clients.push_sum_app)."""

from flower_dp.clients.push_sum_app import make_client_app

app = make_client_app()
