"""The README's Python example: the generator (sync and async) and the pass builder."""

import asyncio

import weft

engine = weft.Engine("smollm2-135m")  # fetched into the cache on first use

# The generator: a sync and async iterator of text deltas, with collectors.
ctx = engine.context()
ctx.fill_chat([{"role": "user", "content": "Name three French cities."}])
for delta in ctx.generate(weft.TopP(0.95, temperature=0.7), max_tokens=48, seed=1):
    print(delta, end="", flush=True)
print()

city = engine.context()
city.fill("A JSON object about Paris:")
schema = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
    "required": ["name", "country"],
}
print(city.generate(weft.Argmax(), max_tokens=48, json_schema=schema).json())


async def stream(prompt: str) -> str:
    c = engine.context()
    c.fill(prompt)
    return "".join([d async for d in c.generate(weft.Argmax(), max_tokens=16)])


async def many() -> list[str]:
    # Eight asyncio tasks: the engine batches their passes into shared model calls.
    return list(await asyncio.gather(*(stream(f"Fact {i} about the sea:") for i in range(8))))


print(asyncio.run(many())[0])

# The pass builder: one pass, a sampler and probes at any position, outputs by handle.
ctx = engine.context()
ctx.fill("The capital of France is")
fwd = ctx.forward()
last = len(fwd) - 1
next_token = fwd.sample([last], weft.Argmax())
entropy = fwd.probe(last, weft.Entropy())
top = fwd.probe(last, weft.Distribution(k=5))
out = fwd.run()  # or: out = await fwd.execute()
ids, probs = out[top]  # NumPy arrays
print(engine.detokenize([out.token(next_token)]), f"entropy {out[entropy]:.2f} nats")
for i, p in zip(ids.tolist(), probs.tolist()):
    print(f"{engine.detokenize([i])!r}: {p:.3f}")
