"""Does a jitted program with lax.cond / lax.while_loop / top_k block the host at dispatch on this backend?

XLA GPU evaluates a conditional's predicate on the host unless the conditional is captured in a command buffer:
then the host thread waits at dispatch until the device reaches the cond, and host work for the next step can no
longer overlap this one. Measures host-side dispatch time vs device time of a ~5 ms matmul chain followed by
(a) nothing, (b) a lax.cond on a device value, (c) a while loop with a device-dependent trip count.

  python benchmarks/probes/dispatch_blocking.py
"""
import time

import jax
import jax.numpy as jnp
from jax import lax


def chain(x, w):
    for _ in range(40):
        x = jnp.tanh(x @ w)
    return x


def plain(x, w):
    return chain(x, w).sum()


def with_cond(x, w):
    y = chain(x, w)
    return lax.cond(y.sum() > 0, lambda: y.sum() + 1, lambda: y.sum() - 1)


def with_while(x, w):
    y = chain(x, w)
    n = (jnp.abs(y[0, 0]) * 3).astype(jnp.int32) + 1
    return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 0.5), (0, y.sum()))[1]


def main():
    n = 4096 if jax.default_backend() == "gpu" else 256  # ~5 ms of matmuls on an H200
    x = jnp.ones((n, n), jnp.bfloat16) * 0.01
    w = jnp.ones((n, n), jnp.bfloat16) * 0.001
    for name, f in (("plain", plain), ("cond", with_cond), ("while", with_while)):
        g = jax.jit(f)
        g(x, w).block_until_ready()
        t0 = time.perf_counter()
        out = g(x, w)
        t1 = time.perf_counter()
        out.block_until_ready()
        t2 = time.perf_counter()
        print(f"{name:6s}: dispatch returned after {1e3 * (t1 - t0):7.3f} ms, result after {1e3 * (t2 - t0):7.3f} ms "
              f"-> {'BLOCKS the host' if (t1 - t0) > 0.5 * (t2 - t0) else 'asynchronous'}")


if __name__ == "__main__":
    main()
