# JAX: a jitted MLP training step (XLA allocates through the driver's
# virtual memory management).
import os
import jax
import jax.numpy as jnp
from common import STEPS, Steps

k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
params = {"w1": jax.random.normal(k1, (256, 512)) * 0.05, "w2": jax.random.normal(k2, (512, 10)) * 0.05}
x = jax.random.normal(k3, (128, 256))
y = jnp.arange(128) % 10


def loss_fn(p):
    h = jax.nn.relu(x @ p["w1"])
    logits = h @ p["w2"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(128), y])


@jax.jit
def step(p):
    l, g = jax.value_and_grad(loss_fn)(p)
    return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g), l


print("devices", jax.devices(), flush=True)
s = Steps()
for i in range(STEPS):
    params, l = step(params)
    s.tick(i, lambda: float(l))
s.done(lambda: jax.block_until_ready(params))
