# TEMPORARY benchmark (helper C); deleted after the device run.
import re, time, numpy as np, jax, jax.numpy as jnp
from jax import lax
from jaxinfer.runner.sampler import sample, SamplingTensors
print(jax.__version__, jax.devices(), flush=True)

def bench(f, *a, n=20):
    jax.block_until_ready(f(*a))
    t = time.perf_counter()
    for _ in range(n):
        r = f(*a)
    jax.block_until_ready(r)
    return (time.perf_counter() - t) / n * 1e3

samp = jax.jit(sample)
for V, S in ((49152, 64), (128256, 8), (128256, 256)):
    x = jax.random.normal(jax.random.key(0), (S, V)) * 3
    flat = jax.random.uniform(jax.random.key(1), (S, V)) * 0.1
    res = {}
    res['topk256'] = bench(jax.jit(lambda x: lax.top_k(x * 0.5, 256)), x)
    res['topk20'] = bench(jax.jit(lambda x: lax.top_k(x, 20)), x)
    res['sort'] = bench(jax.jit(lambda x: lax.sort((x, lax.broadcasted_iota(jnp.int32, x.shape, 1)), dimension=1, num_keys=1)), x)
    res['lse'] = bench(jax.jit(lambda x: jax.nn.logsumexp(x, -1)), x)
    res['gumbelV'] = bench(jax.jit(lambda k: jax.vmap(lambda k: jax.random.gumbel(k, (V,)))(k)), jax.random.split(jax.random.key(0), S))
    for name, row, lg in [('greedy', dict(temperature=0), x), ('full', dict(), x), ('topp.9', dict(top_p=0.9), x),
                          ('topk50', dict(top_k=50), x), ('minp', dict(min_p=0.05), x), ('fallback', dict(top_p=0.9), flat),
                          ('topk1000', dict(top_k=1000), x)]:
        t = SamplingTensors.from_rows([dict(row, seed=i) for i in range(S)], S)
        res[name] = bench(samp, lg, t)
    print(V, S, ' '.join(f'{k}={v:.3f}ms' for k, v in res.items()), flush=True)
    if S == 256:
        t = SamplingTensors.from_rows([dict(top_p=0.9, seed=i) for i in range(S)], S)
        txt = samp.lower(x, t).compile().as_text()
        ops = re.findall(r'= \S+ (sort|custom-call|conditional)\(', txt)
        tg = re.findall(r'custom_call_target="([^"]+)"', txt)
        print('compiled ops:', {o: ops.count(o) for o in set(ops)}, 'targets:', sorted(set(tg)), flush=True)
        for l in txt.splitlines():
            if re.search(r' (sort|custom-call)\(', l):
                print('   ', l.strip()[:160])
