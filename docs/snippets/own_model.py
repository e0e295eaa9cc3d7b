import torch
import flower_dp

def make_model():  # your own nn.Module
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))

x = torch.randn(2000, 20, generator=torch.Generator().manual_seed(0))  # your own tensors
y = x[:, :3].argmax(1)
run = flower_dp.train_private(make_model, (x[:1600], y[:1600]), (x[1600:], y[1600:]), n_nodes=4, num_iters=40,
                              target_epsilon=3.0, delta=1e-5, clip=1.0, batch_size=32, lr=0.2, out_dir="run_out")
eps = run.privacy_spent()
print(f"test accuracy {run.final_accuracy:.3f} at eps = {eps.epsilon:.2f}, delta = {eps.delta:g}")
