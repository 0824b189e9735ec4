//! `weft bench --speculate`: greedy decoding of a repetitive task (copying a code block), with
//! and without the n-gram drafter.

use std::time::Instant;

use weft::{block_on, Engine, Sampler};

/// The repetitive task of `--speculate`: copy a code block.
pub(super) const REWRITE_PROMPT: &str = r#"Rewrite the following code exactly as it is.

```python
def merge_sorted(a, b):
    result = []
    i, j = 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result


def merge_sort(items):
    if len(items) <= 1:
        return items
    middle = len(items) // 2
    left = merge_sort(items[:middle])
    right = merge_sort(items[middle:])
    return merge_sorted(left, right)
```

Rewritten:

```python
"#;

/// Seconds for a greedy generation of `n` tokens of the rewrite task, and (drafted,
/// accepted) draft tokens.
pub(super) fn rewrite(
    engine: &Engine,
    n: usize,
    speculate: bool,
) -> anyhow::Result<(f64, usize, (usize, usize))> {
    let mut ctx = engine.context();
    ctx.fill(REWRITE_PROMPT)?;
    block_on(ctx.flush_logits())?;
    let g = ctx.generate(Sampler::Argmax).max_tokens(n);
    let mut g = if speculate { g.system_speculation() } else { g };
    let t = Instant::now();
    while let Some(step) = g.next()? {
        block_on(step.execute())?;
    }
    Ok((
        t.elapsed().as_secs_f64(),
        g.tokens_generated(),
        g.speculation_stats(),
    ))
}
