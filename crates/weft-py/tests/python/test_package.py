"""The package as a user meets it: the README's Python block and its runnable version run, and
the type stubs match the native module and type-check that example."""

import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)


def test_the_readme_example_runs():
    r = run(str(EXAMPLE))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any("'name'" in line and "'country'" in line for line in lines), r.stdout
    assert any(line.startswith(" Paris entropy") for line in lines), r.stdout


def test_the_readme_python_block_runs_as_written():
    readme = (pathlib.Path(__file__).resolve().parents[4] / "README.md").read_text()
    blocks = [b.split("```")[0] for b in readme.split("```python\n")[1:]]
    block = next(b for b in blocks if "import weft" in b)
    r = run("-c", block)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # The streamed reply ends its own line: the JSON object's dict starts the next one.
    assert any(line.startswith("{'name': ") for line in lines), r.stdout
    assert lines[-1].strip(), r.stdout


def test_stubs_match_the_native_module():
    r = run("-m", "mypy.stubtest", "weft")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_example_type_checks_against_the_stubs():
    r = run("-m", "mypy", "--strict", "--no-incremental", str(EXAMPLE))
    assert r.returncode == 0, r.stdout + r.stderr


SCRIPT = """
import asyncio, weft
engine = weft.Engine("smollm2-135m", threads=2)

async def one(i):
    ctx = engine.context()
    ctx.fill(f"Fact {i} about the sea:")
    return "".join([d async for d in ctx.generate(weft.Argmax(), max_tokens=24)])

async def main():
    return await asyncio.gather(*(one(i) for i in range(16)))

asyncio.run(main())
print("done")
"""


def test_the_interpreter_exits_cleanly_after_async_use():
    # The async runtime's threads deliver results holding the GIL; one still in Python when
    # the interpreter finalizes would abort it (PyGILState_Release). Exit right after.
    for _ in range(5):
        r = run("-c", SCRIPT)
        assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr[-2000:]


def test_star_import_brings_no_private_helper():
    import weft

    assert "_quiesce" not in weft.__all__
    assert "Engine" in weft.__all__ and "Generation" in weft.__all__
