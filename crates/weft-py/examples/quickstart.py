"""The README's Python example: the generator (sync and async), the pass builder and manual
stepping."""

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

# Stepping a generation by hand: read each step's distribution, choose the token yourself
# (here: the most likely one that is not a comma), and hand it back with accept().
ctx = engine.context()
ctx.fill("Red, green and blue are")
gen = ctx.generate(max_tokens=12)
each = gen.probe_each_step(0, weft.Entropy())
comma = engine.tokenize(",")[0]
while (step := gen.next_step()) is not None:
    step.clear_sampler()
    dist = step.probe(0, weft.Distribution(k=2))
    result = step.run()  # or: result = await step.execute()
    ids, _ = result[dist]
    gen.accept([int(ids[1] if ids[0] == comma else ids[0])])
    print(f"{gen.tokens_generated}: entropy {result[each]:.2f}")
print(gen.text())
