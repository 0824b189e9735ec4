"""Type stubs of weft's native module (re-exported by the ``weft`` package)."""

from typing import Callable, Protocol, final, Final, Literal, Generic, TypeVar, Any, AsyncIterator, Awaitable, Coroutine, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union, overload

import os

import numpy as np
from typing_extensions import disjoint_base
import numpy.typing as npt

_T = TypeVar("_T")
_F32 = npt.NDArray[np.float32]

__version__: str
__all__ = [
    "Adapter",
    "Argmax",
    "BeamHypothesis",
    "AttentionBias",
    "BeamSearchError",
    "Chain",
    "ChatTemplateError",
    "ConfigError",
    "Context",
    "ContextBusy",
    "ContextTooLong",
    "Distribution",
    "Embedder",
    "EmptyPass",
    "Engine",
    "EngineStopped",
    "Entropy",
    "Forward",
    "ForwardOutput",
    "Generation",
    "GrammarError",
    "Hidden",
    "HubError",
    "IndexOutOfRange",
    "InputEmbeds",
    "InvalidSampler",
    "IoError",
    "JsonError",
    "KvCacheFull",
    "Logits",
    "Logprob",
    "Logprobs",
    "MaskLength",
    "Metrics",
    "MinP",
    "ModelError",
    "ModelFingerprintMismatch",
    "NanLogits",
    "NothingAllowed",
    "PaddedBatch",
    "PositionCount",
    "PositionOutOfRange",
    "Probe",
    "ProbeHandle",
    "RewindPastWindow",
    "Rollout",
    "SampleHandle",
    "Sampler",
    "SnapshotCorrupt",
    "SnapshotVersion",
    "StalePass",
    "Step",
    "StepOutput",
    "Temperature",
    "TokenNotAllowed",
    "TokenOutOfVocab",
    "TopK",
    "TopP",
    "TruncateTooLong",
    "WeftError",
    "__version__",
    "beam_search",
    "generate_batch",
]

# --- samplers -------------------------------------------------------------------------------

@disjoint_base
class Sampler:
    """How a token is chosen from the next-token distribution. Use a subclass."""

@final
class Argmax(Sampler):
    """Always the most likely token (greedy)."""
    def __new__(cls) -> Argmax: ...

@final
class Temperature(Sampler):
    """Plain sampling from the softmax at ``temperature`` (0 = greedy)."""
    def __new__(cls, temperature: float) -> Temperature: ...

@final
class TopK(Sampler):
    """Sampling among the ``k`` most likely tokens."""
    def __new__(cls, k: int, temperature: float = 1.0) -> TopK: ...

@final
class TopP(Sampler):
    """Nucleus sampling: the smallest set of most likely tokens with mass >= ``p``."""
    def __new__(cls, p: float, temperature: float = 1.0) -> TopP: ...

@final
class MinP(Sampler):
    """Sampling among the tokens at least ``p`` times as likely as the most likely one."""
    def __new__(cls, p: float, temperature: float = 1.0) -> MinP: ...

@final
class Chain(Sampler):
    """Top-k (0: off), then top-p, then min-p, in llama.cpp's order, all on the probabilities
    at the temperature, as Hugging Face's warpers and vLLM filter (llama.cpp applies its
    temperature after top-p and min-p, so at a temperature other than 1 those keep other sets)."""
    def __new__(cls, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, temperature: float = 0.8) -> Chain: ...

# --- probes ---------------------------------------------------------------------------------

@disjoint_base
class Probe:
    """Something a pass reports at a position besides the sampled token. Use a subclass."""

@final
class Logits(Probe):
    """The raw next-token logits: a float32 array over the vocabulary."""
    def __new__(cls) -> Logits: ...

@final
class Distribution(Probe):
    """The softmax at ``temperature`` over the ``k`` most likely ids (``k = 0``: all): ``(ids, probs)``."""
    def __new__(cls, temperature: float = 1.0, k: int = 0) -> Distribution: ...

@final
class Logprob(Probe):
    """The log-probability (natural log, temperature 1) of one token id: a float."""
    def __new__(cls, token_id: int) -> Logprob: ...

@final
class Logprobs(Probe):
    """The log-probabilities of several token ids, in the order given: a float32 array."""
    def __new__(cls, token_ids: Sequence[int]) -> Logprobs: ...

@final
class Entropy(Probe):
    """The entropy (nats) of the next-token distribution at temperature 1: a float."""
    def __new__(cls) -> Entropy: ...

@final
class Hidden(Probe):
    """The hidden state after the final norm: a float32 array of ``n_embd`` values."""
    def __new__(cls) -> Hidden: ...

# --- engine ---------------------------------------------------------------------------------

@final
class Metrics:
    """The scheduler's counters (``Engine.metrics()``)."""
    steps: Final[int]
    passes: Final[int]
    mean_batch_passes: Final[float]
    max_batch_passes: Final[int]
    mean_batch_tokens: Final[float]
    tokens_prefilled: Final[int]
    tokens_decoded: Final[int]
    kv_pages_used: Final[int]
    kv_pages_free: Final[int]
    prefix_queried_tokens: Final[int]
    prefix_hit_tokens: Final[int]
    def __new__(
        cls,
        steps: int = 0,
        passes: int = 0,
        mean_batch_passes: float = 0.0,
        max_batch_passes: int = 0,
        mean_batch_tokens: float = 0.0,
        tokens_prefilled: int = 0,
        tokens_decoded: int = 0,
        kv_pages_used: int = 0,
        kv_pages_free: int = 0,
        prefix_queried_tokens: int = 0,
        prefix_hit_tokens: int = 0,
    ) -> Metrics: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Adapter:
    """A LoRA adapter loaded for one engine's model (``Engine.load_adapter``)."""
    @property
    def name(self) -> str: ...

@final
class Engine:
    """A loaded model with its scheduler thread; every context of one engine shares its model calls.

    ``model`` is a known name (``"smollm2-135m"``, ``"gemma3-270m"``; fetched on first use), a GGUF path,
    or a Hugging Face checkpoint folder (Llama or Gemma 3 safetensors with ``config.json`` and
    ``tokenizer.json``), whose matrices are stored as ``weights`` (``"q8_0"``, ``"f16"`` or ``"f32"``);
    a GGUF file keeps its types unless ``"f16"`` or ``"f32"`` widens its quantized matrices (float
    activations, for small perturbations such as zeroth-order training; slower).
    ``threads``: threads of the forward pass (default: the machine's cores). ``kv_tokens``: the KV
    cache's capacity in tokens, shared by every context (default 16384). ``n_ctx``: the longest one
    context may grow (default: the model's training context, at most ``kv_tokens``; a larger value
    enlarges the cache). ``kv_type``: ``"f16"`` or ``"q8_0"`` (half the KV memory).
    ``prefix_cache``: contexts that start alike share their full KV pages (outputs unchanged).
    ``resident_layers``: keep at most that many blocks in memory (slower; for large models).
    ``sampler``: the sampler ``generate`` uses when given none (default: greedy).
    """
    def __new__(
        cls,
        model: Union[str, os.PathLike[str]] = "smollm2-135m",
        threads: Optional[int] = None,
        kv_tokens: Optional[int] = None,
        n_ctx: Optional[int] = None,
        kv_type: Optional[str] = None,
        prefix_cache: bool = True,
        resident_layers: Optional[int] = None,
        weights: Optional[str] = None,
        sampler: Optional[Sampler] = None,
    ) -> Engine: ...
    @staticmethod
    def from_bytes(
        model: Union[bytes, bytearray, memoryview],
        tokenizer_json: Optional[str] = None,
        *,
        threads: Optional[int] = None,
        kv_tokens: Optional[int] = None,
        n_ctx: Optional[int] = None,
        kv_type: Optional[str] = None,
        prefix_cache: bool = True,
        sampler: Optional[Sampler] = None,
    ) -> Engine:
        """An engine on a GGUF model held in memory, with its own tokenizer or a ``tokenizer.json`` text."""
    def config(self) -> Dict[str, Any]:
        """The settings as resolved: threads, kv_tokens, n_ctx, kv_type, prefix_cache,
        resident_layers, weights, sampler."""
    def is_eos(self, token: int) -> bool:
        """Whether ``token`` is one of ``stop_tokens``."""
    def lora_stack(self) -> List[Tuple[Adapter, float]]:
        """The adapter stack, first pushed first."""
    def context(self) -> Context:
        """A new, empty context on this engine, with a sampling seed drawn at random:
        ``set_seed`` or ``generate(seed=...)`` make its samples reproducible."""
    def resume(self, snapshot: Union[bytes, bytearray, memoryview]) -> Context:
        """The context a ``Context.snapshot()`` holds, going on where it was taken."""
    def input_embeddings(self, ids: Sequence[int]) -> _F32:
        """The vectors the first block reads for ``ids`` (``len(ids) × n_embd``)."""
    def load_adapter(self, path: Union[str, os.PathLike[str]]) -> Adapter:
        """A LoRA adapter (llama.cpp GGUF LoRA file or PEFT directory) for this model."""
    def push_lora(self, adapter: Adapter, scale: float = 1.0) -> None: ...
    def pop_lora(self) -> Optional[Tuple[Adapter, float]]: ...
    def clear_loras(self) -> None: ...
    def tokenize(self, text: str, add_bos: bool = False, parse_special: bool = True) -> List[int]:
        """The token ids of ``text`` (special tokens written in the text are parsed unless
        ``parse_special`` is false)."""
    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of ``ids``: control tokens (``<|im_end|>``, padding) rendered as their text,
        or left out when ``skip_special`` is true; a leading BOS the tokenizer adds is dropped."""
    def metrics(self) -> Metrics:
        """The scheduler's counters now."""
    @property
    def n_ctx(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def stop_tokens(self) -> List[int]: ...
    @overload
    def embed(self, texts: str, pooling: Optional[str] = None, normalize: bool = True) -> npt.NDArray[np.float32]: ...
    @overload
    def embed(self, texts: Sequence[str], pooling: Optional[str] = None, normalize: bool = True) -> npt.NDArray[np.float32]: ...

@final
class Embedder:
    """A sentence-embedding encoder (e.g. ``"all-minilm-l6-v2"``) or a GGUF decoder used for embeddings."""
    def __new__(
        cls, model: Union[str, os.PathLike[str]] = "all-minilm-l6-v2", threads: Optional[int] = None
    ) -> Embedder: ...
    @property
    def dimensions(self) -> int: ...
    @overload
    def embed(self, texts: str, pooling: Optional[str] = None, normalize: bool = True) -> npt.NDArray[np.float32]: ...
    @overload
    def embed(self, texts: Sequence[str], pooling: Optional[str] = None, normalize: bool = True) -> npt.NDArray[np.float32]: ...

# --- contexts and generation ----------------------------------------------------------------

class _Constraint(Protocol):
    """What ``generate(constrain=...)`` takes (``is_terminal`` is optional)."""
    def allowed(self, accepted: List[int], vocab_size: int) -> Union[Sequence[int], npt.NDArray[np.bool_], None]: ...

class _Speculator(Protocol):
    """What ``generate(speculator=...)`` takes (``accepted`` is optional)."""
    def draft(self, tokens: List[int], max: int) -> Optional[Sequence[int]]: ...

@final
class Context:
    """A sequence of tokens with its KV cache."""
    def fill(self, text: str) -> None: ...
    def fill_tokens(self, ids: Sequence[int]) -> None: ...
    def fill_chat(self, messages: Sequence[Mapping[str, str]]) -> None:
        """Makes the context hold the whole conversation rendered by the chat template, the
        assistant's turn opened; a context holding an earlier turn keeps what it shares."""
    def fork(self) -> Context: ...
    def snapshot(self) -> bytes:
        """The context as bytes for ``Engine.resume`` (LoRA adapters not recorded: resume with the same ones)."""
    def evict(self) -> None:
        """Gives the KV pages back, keeping the tokens (pending again, recomputed by the next pass)."""
    def fill_embeds(
        self, ids: Sequence[int], rows: npt.ArrayLike, attn_bias: Optional[npt.ArrayLike] = None
    ) -> None:
        """Appends tokens given as vectors (``len(ids) × n_embd``), recorded as ``ids``."""
    def resume_generation(self, *, max_tokens: Optional[int] = None, horizon: Optional[int] = None) -> Generation:
        """Takes up the generation saved by ``Generation.snapshot()`` in the snapshot this context was resumed from."""
    def truncate(self, n: int) -> None: ...
    def set_seed(self, seed: int) -> None: ...
    @property
    def tokens(self) -> List[int]:
        """Tokens already run (in the KV cache)."""
    @property
    def pending(self) -> List[int]:
        """Tokens filled but not run yet."""
    def __len__(self) -> int:
        """Tokens already run, as ``len(ctx.tokens)``; ``ctx.pending`` counts once a pass runs it."""
    def generate(
        self,
        sampler: Optional[Sampler] = None,
        *,
        max_tokens: Optional[int] = None,
        min_tokens: Optional[int] = None,
        stop: Optional[Union[str, Sequence[Union[str, int]]]] = None,
        stop_token_ids: Optional[Sequence[int]] = None,
        stop_sequences: Optional[Sequence[Sequence[int]]] = None,
        json_schema: Optional[Union[Dict[str, Any], bool, str]] = None,
        regex: Optional[str] = None,
        grammar: Optional[str] = None,
        gbnf: Optional[str] = None,
        speculate: bool = False,
        seed: Optional[int] = None,
        ignore_eos: bool = False,
        logit_bias: Optional[Mapping[int, float]] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        adapters: Optional[Sequence[Tuple[Adapter, float]]] = None,
        constrain: Optional[Union[_Constraint, List[_Constraint]]] = None,
        speculator: Optional[_Speculator] = None,
        horizon: Optional[int] = None,
        zo_seed: Optional[int] = None,
        zo_sigma: Optional[float] = None,
    ) -> Generation: ...
    def prefill(self, tokens: Sequence[int] = ...) -> _F32:
        """Fills ``tokens``, runs them with anything pending; the logits after the last one."""
    def decode(self, token: int) -> _F32:
        """Runs one given token; the logits after it."""
    def forward(self) -> Forward: ...

@final
class Generation(Iterator[str], AsyncIterator[str]):
    """A running generation: a sync and async iterator of text deltas, with collectors, or
    stepped by hand with ``next_step()`` and ``accept()``."""
    def __iter__(self) -> Generation: ...
    def __next__(self) -> str: ...
    def __aiter__(self) -> Generation: ...
    def __anext__(self) -> Awaitable[str]: ...
    def text(self) -> str:
        """Runs to the end; the whole output text, the deltas already iterated included."""
    def tokens(self) -> List[int]: ...
    def json(self) -> Any: ...
    def atext(self) -> Coroutine[Any, Any, str]: ...
    def atokens(self) -> Coroutine[Any, Any, List[int]]: ...
    def ajson(self) -> Coroutine[Any, Any, Any]: ...
    def close(self) -> None: ...
    def aclose(self) -> Coroutine[Any, Any, None]: ...
    @property
    def stop_reason(self) -> Optional[str]: ...
    @property
    def text_so_far(self) -> str: ...
    @property
    def is_done(self) -> bool: ...
    @property
    def tokens_generated(self) -> int: ...
    def next_step(self) -> Optional[Step]:
        """The next step, or None once the generation has stopped."""
    def accept(self, tokens: Sequence[int]) -> None:
        """Registers tokens chosen outside the loop (after a step without its sampler)."""
    @overload
    def probe_each_step(self, index: int, probe: Distribution) -> ProbeHandle[Tuple[npt.NDArray[np.uint32], _F32]]: ...
    @overload
    def probe_each_step(self, index: int, probe: Union[Entropy, Logprob]) -> ProbeHandle[float]: ...
    @overload
    def probe_each_step(self, index: int, probe: Union[Logits, Logprobs, Hidden]) -> ProbeHandle[_F32]: ...
    def evict(self) -> None:
        """Gives the context's KV pages back; the next step recomputes them."""
    def snapshot(self) -> bytes:
        """The context with this generation in flight, for ``Engine.resume`` + ``resume_generation``."""

@final
class Step:
    """One step of a generation: add probes, optionally drop the sampler, then run it once."""
    def clear_sampler(self) -> None: ...
    @overload
    def probe(self, index: int, probe: Distribution) -> ProbeHandle[Tuple[npt.NDArray[np.uint32], _F32]]: ...
    @overload
    def probe(self, index: int, probe: Union[Entropy, Logprob]) -> ProbeHandle[float]: ...
    @overload
    def probe(self, index: int, probe: Union[Logits, Logprobs, Hidden]) -> ProbeHandle[_F32]: ...
    def run(self) -> StepOutput: ...
    def execute(self) -> Coroutine[Any, Any, StepOutput]: ...

@final
class StepOutput:
    """What a step returned: the tokens it took and its probes, read by handle."""
    @property
    def token(self) -> Optional[int]: ...
    @property
    def accepted(self) -> List[int]: ...
    @property
    def allowed(self) -> Optional[List[int]]: ...
    def __getitem__(self, handle: ProbeHandle[_T]) -> _T: ...

# --- the pass builder -----------------------------------------------------------------------

@final
class SampleHandle:
    """Reads the tokens a sampler chose from its pass's output."""

@final
class ProbeHandle(Generic[_T]):
    """Reads a probe's value (of type ``_T``) from its pass's output."""
    @classmethod
    def __class_getitem__(cls, item: Any) -> Any: ...

@final
class Forward:
    """One pass: inputs, masks, samplers and probes; runs on ``execute()`` or ``run()``. The
    methods that record a setting return the pass, so calls chain:
    ``ctx.forward().input(ids).probe(0, Entropy())``."""
    def input(self, ids: Sequence[int]) -> Forward: ...
    def input_at(self, ids: Sequence[int], positions: Sequence[int]) -> Forward: ...
    def attention_mask(
        self, rows: Union[Sequence[Sequence[bool]], Sequence[Sequence[int]], npt.ArrayLike]
    ) -> Forward: ...
    def input_embeds(
        self, rows: npt.ArrayLike, positions: Sequence[int], ids: Optional[Sequence[int]] = None
    ) -> Forward: ...
    def attention_bias(self, rows: Sequence[Sequence[float]]) -> Forward: ...
    def mask(self, allowed: Sequence[int]) -> Forward: ...
    def logit_bias(self, bias: Mapping[int, float]) -> Forward: ...
    def horizon(self, n: int) -> Forward: ...
    def adapter(self, adapter: Adapter, scale: float = 1.0) -> Forward: ...
    def zo_seed(self, seed: int, sigma: float) -> Forward: ...
    def sample(
        self,
        indices: Sequence[int],
        sampler: Sampler,
        masks: Optional[Sequence[Sequence[int]]] = None,
    ) -> SampleHandle: ...
    @overload
    def probe(self, index: int, probe: Distribution) -> ProbeHandle[Tuple[npt.NDArray[np.uint32], _F32]]: ...
    @overload
    def probe(self, index: int, probe: Union[Entropy, Logprob]) -> ProbeHandle[float]: ...
    @overload
    def probe(self, index: int, probe: Union[Logits, Logprobs, Hidden]) -> ProbeHandle[_F32]: ...
    def __len__(self) -> int: ...
    def execute(self) -> Coroutine[Any, Any, ForwardOutput]: ...
    def run(self) -> ForwardOutput: ...

@final
class ForwardOutput:
    """A pass's outputs, read by handle."""
    @overload
    def __getitem__(self, handle: SampleHandle) -> List[int]: ...
    @overload
    def __getitem__(self, handle: ProbeHandle[_T]) -> _T: ...
    def token(self, handle: SampleHandle) -> int: ...
    def tokens(self, handle: SampleHandle) -> List[int]: ...

# --- rollouts -------------------------------------------------------------------------------

@final
class Rollout:
    """One generated sequence of a batch."""
    prompt_tokens: Final[List[int]]
    tokens: Final[List[int]]
    text: Final[str]
    stop_reason: Final[Optional[str]]
    sequence: Final[List[int]]
    def __new__(
        cls,
        prompt_tokens: List[int],
        tokens: List[int],
        text: str,
        stop_reason: Optional[str],
        sequence: List[int],
    ) -> Rollout: ...

@overload
def generate_batch(
    engine: Engine,
    prompts: Union[Sequence[str], Sequence[Sequence[int]], npt.ArrayLike],
    sampler: Optional[Sampler] = None,
    *,
    max_tokens: Optional[int] = 128,
    max_length: Optional[int] = None,
    stop_sequences: Optional[Sequence[Sequence[int]]] = None,
    seed: Optional[int] = None,
    attention_mask: Optional[npt.ArrayLike] = None,
    padded: Literal[False] = False,
    pad_token_id: Optional[int] = None,
    every: int = 0,
    on_partial: Optional[Callable[[List[Rollout]], object]] = None,
    stop: Optional[Union[str, Sequence[Union[str, int]]]] = None,
    min_tokens: Optional[int] = 0,
    ignore_eos: bool = False,
    logit_bias: Optional[Mapping[int, float]] = None,
    repeat_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    penalty_last_n: Optional[int] = None,
    adapters: Optional[Sequence[Tuple[Adapter, float]]] = None,
) -> List[Rollout]: ...
@overload
def generate_batch(
    engine: Engine,
    prompts: Union[Sequence[str], Sequence[Sequence[int]], npt.ArrayLike],
    sampler: Optional[Sampler] = None,
    *,
    max_tokens: Optional[int] = 128,
    max_length: Optional[int] = None,
    stop_sequences: Optional[Sequence[Sequence[int]]] = None,
    seed: Optional[int] = None,
    attention_mask: Optional[npt.ArrayLike] = None,
    padded: Literal[True],
    pad_token_id: Optional[int] = None,
    every: int = 0,
    on_partial: Optional[Callable[[List[Rollout]], object]] = None,
    stop: Optional[Union[str, Sequence[Union[str, int]]]] = None,
    min_tokens: Optional[int] = 0,
    ignore_eos: bool = False,
    logit_bias: Optional[Mapping[int, float]] = None,
    repeat_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    penalty_last_n: Optional[int] = None,
    adapters: Optional[Sequence[Tuple[Adapter, float]]] = None,
) -> Tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint8]]: ...

@final
class BeamHypothesis:
    """A finished beam: prompt + output (+ EOS) tokens and HF's length-penalized score."""
    tokens: Final[List[int]]
    prompt_len: Final[int]
    score: Final[float]
    sum_logprobs: Final[float]
    def __new__(
        cls, tokens: List[int], prompt_len: int, score: float, sum_logprobs: float
    ) -> BeamHypothesis: ...
    @property
    def generated(self) -> List[int]: ...

def beam_search(
    engine: Engine,
    prompt: Union[str, Sequence[int]],
    num_beams: int = 4,
    *,
    max_new_tokens: int = 20,
    num_return_sequences: int = 1,
    length_penalty: float = 1.0,
    early_stopping: Union[bool, Literal["never"], None] = None,
    eos_token_ids: Optional[Sequence[int]] = None,
    allowed_tokens: Optional[Sequence[int]] = None,
) -> List[BeamHypothesis]: ...

# --- errors ---------------------------------------------------------------------------------

class WeftError(Exception): ...
class ModelError(WeftError): ...
class KvCacheFull(ModelError): ...
class RewindPastWindow(ModelError): ...
class NanLogits(ModelError): ...
class HubError(WeftError): ...
class ChatTemplateError(WeftError): ...
class InvalidSampler(WeftError): ...
class IndexOutOfRange(WeftError): ...
class TokenOutOfVocab(WeftError): ...
class TokenNotAllowed(WeftError): ...
class PositionCount(WeftError): ...
class PositionOutOfRange(WeftError): ...
class MaskLength(WeftError): ...
class InputEmbeds(WeftError): ...
class AttentionBias(WeftError): ...
class PaddedBatch(WeftError): ...
class ContextTooLong(WeftError): ...
class EmptyPass(WeftError): ...
class NothingAllowed(WeftError): ...
class TruncateTooLong(WeftError): ...
class ConfigError(WeftError): ...
class GrammarError(WeftError): ...
class JsonError(WeftError): ...
class SnapshotCorrupt(WeftError): ...
class SnapshotVersion(WeftError): ...
class ModelFingerprintMismatch(WeftError): ...
class BeamSearchError(WeftError): ...
class IoError(WeftError): ...
class EngineStopped(WeftError): ...
class ContextBusy(WeftError): ...
class StalePass(ContextBusy): ...

def _quiesce() -> None:
    """Run at exit: lets the async runtime's threads leave Python before finalization."""

@final
class _Failed:
    """An awaitable's error on its way to the awaiting coroutine (see ``weft._aio``)."""
    def raise_(self) -> None: ...
