"""ClientApp.  Before (FedAvg):

    app = ClientApp()

    @app.train()
    def train(msg, context):
        model = Net(); model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
        ...local epochs...; return Message(RecordDict({"arrays": ..., "metrics": ...}), reply_to=msg)

After (private push-sum; the node trains with the algorithm's DP steps and gossips its shares):
"""

from flower_dp.clients import make_client_app, model_builder

from .task import Net, load_data

app = make_client_app(model_builder(Net, load_data))
