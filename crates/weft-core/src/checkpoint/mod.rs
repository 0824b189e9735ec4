//! Decoders from a Hugging Face checkpoint folder (`config.json`, `*.safetensors`,
//! `tokenizer.json`): converted at load time into the GGUF layout weft's model files read, as
//! llama.cpp's `convert_hf_to_gguf.py` would write it, and quantized to Q8_0 for weft's kernels
//! (or kept in f16 or f32).
//!
//! What the conversion does, tensor by tensor:
//! - renames `model.layers.N.self_attn.q_proj.weight` → `blk.N.attn_q.weight` and so on (the
//!   `model.`, `model.language_model.` or `language_model.model.` prefix of a multimodal Gemma 3
//!   is found from its embedding table; its vision tensors are left out);
//! - Llama's Q and K rows are permuted from the halves Hugging Face rotates (`rotate_half`) to the
//!   adjacent pairs weft's Llama rotates, as llama.cpp's converter does;
//! - Gemma's RMSNorm weights are stored as `w` and applied as `1 + w`: 1 is added, as llama.cpp's
//!   converter does, because weft's Gemma 3 multiplies by the stored weight;
//! - matrices (F32, F16 or BF16) become Q8_0 (32 values per block, one f16 scale: near-lossless,
//!   and the type weft's tied Gemma head already uses), or F16 or F32 when asked
//!   ([`WeightType`]); norms stay F32.
//!
//! The tokenizer is `tokenizer.json`, kept whole in `tokenizer.huggingface.json` (GGUF's key for
//! it, which [`Tokenizer::from_gguf`](crate::tokenizer::Tokenizer::from_gguf) reads); the
//! special token ids come from `config.json`, `generation_config.json` and
//! `tokenizer_config.json`; the chat template from `chat_template.jinja` or
//! `tokenizer_config.json`. Each goes into the GGUF's metadata under the key llama.cpp uses, so
//! everything downstream reads one kind of file.

pub mod config;
mod widen;

pub use widen::widen;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::gguf::{GgmlType, GgufWriter, Value as Meta};
use crate::kernels::quantize::quantize_row_q8_0;
use crate::models::TensorFile;
use config::{bad, token_id, Family, HfConfig};

/// The version of the conversion's output: caches of converted files are keyed by it, so it
/// changes whenever [`convert`] writes other bytes for the same checkpoint.
pub const VERSION: u32 = 1;

/// The checkpoint folder `path` names: the folder itself, or the folder of a `.safetensors`
/// file in it; `None` when `path` is neither or the folder has no `config.json`.
pub fn folder_of(path: &Path) -> Option<PathBuf> {
    let dir = if path.is_dir() {
        path
    } else if path.extension().is_some_and(|e| e == "safetensors") {
        path.parent()?
    } else {
        return None;
    };
    dir.join("config.json").is_file().then(|| dir.to_path_buf())
}

/// The `model_type`s of encoder families (the sentence-transformers models; weft's `Embedder`
/// runs BERT): a folder of one is not a generator to convert.
const ENCODER_TYPES: [&str; 11] = [
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "mpnet",
    "electra",
    "albert",
    "camembert",
    "deberta",
    "deberta-v2",
    "nomic_bert",
];

/// Whether the folder holds an encoder rather than a generator: a sentence-transformers folder
/// (`modules.json`), or a `config.json` of an encoder family. A folder whose `config.json`
/// cannot be read is not one: [`convert`] says what is wrong with it.
pub fn is_encoder(dir: &Path) -> bool {
    if dir.join("modules.json").is_file() || dir.join("config_sentence_transformers.json").is_file()
    {
        return true;
    }
    read_json(&dir.join("config.json")).is_ok_and(|c| {
        c.get("model_type")
            .and_then(Value::as_str)
            .is_some_and(|t| ENCODER_TYPES.contains(&t))
    })
}

/// The folder of an encoder that `path` names (the folder or its `model.safetensors`), if it
/// is one ([`folder_of`], then [`is_encoder`]).
pub fn encoder_folder(path: &Path) -> Option<PathBuf> {
    folder_of(path).filter(|dir| is_encoder(dir))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("{} is not JSON: {e}", path.display())))
}

fn opt_json(path: &Path) -> Result<Option<Value>> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// Converts the checkpoint in `dir` (see the module docs).
///
/// ```no_run
/// use weft_core::{checkpoint, gguf::GgufFile, tokenizer::Tokenizer};
/// let dir = "SmolLM2-135M-Instruct".as_ref();
/// let file = GgufFile::from_bytes(checkpoint::convert(dir, checkpoint::WeightType::Q8_0)?)?;
/// assert_eq!(file.architecture()?, "llama");
/// let tok = Tokenizer::from_gguf(&file)?;
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn convert(dir: &Path, weights: WeightType) -> Result<Vec<u8>> {
    let files = open_weights(dir)?;
    let (mut w, cfg) = metadata(dir)?;
    Tensors::new(&files, &cfg, weights)?.write_all(&mut w)?;
    Ok(w.into_bytes())
}

/// The GGUF file [`convert`] makes of the checkpoint in `dir`, without its tensors: the
/// hyper-parameters, the tokenizer with its special ids, the chat template. What tokenizing
/// with the checkpoint needs, read in a moment (a whole conversion quantizes every matrix).
///
/// ```no_run
/// use weft_core::{checkpoint, gguf::GgufFile, tokenizer::Tokenizer};
/// let file = GgufFile::from_bytes(checkpoint::convert_metadata("SmolLM2-135M".as_ref())?)?;
/// let ids = Tokenizer::from_gguf(&file)?.encode("Hello", true, true);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn convert_metadata(dir: &Path) -> Result<Vec<u8>> {
    Ok(metadata(dir)?.0.into_bytes())
}

/// The metadata of [`convert`]'s file, and the configuration its tensors are made with.
fn metadata(dir: &Path) -> Result<(GgufWriter, HfConfig)> {
    let top = read_json(&dir.join("config.json"))?;
    let cfg = config::read(&top)?;
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        return Err(Error::BadTokenizer {
            reason: format!(
                "{} has no tokenizer.json (weft reads the tokenizer of a safetensors checkpoint from it; a SentencePiece tokenizer.model alone is not supported)",
                dir.display()
            ),
        });
    }
    let tokenizer_json = std::fs::read_to_string(&tok_path).map_err(io(&tok_path))?;
    let tokenizer: Value =
        serde_json::from_str(&tokenizer_json).map_err(|e| Error::BadTokenizer {
            reason: format!("{} is not JSON: {e}", tok_path.display()),
        })?;
    let mut w = GgufWriter::new();
    let arch = cfg.family.arch();
    w.metadata("general.architecture", Meta::String(arch.into()));
    for (key, value) in &cfg.meta {
        w.metadata(&format!("{arch}.{key}"), value.clone());
    }
    tokenizer_metadata(&mut w, dir, &cfg, &tokenizer)?;
    drop(tokenizer); // a large tree for a large vocabulary: gone before the tensors come
    w.metadata("tokenizer.huggingface.json", Meta::String(tokenizer_json));
    Ok((w, cfg))
}

/// The id of the token `text` in a `tokenizer.json`: an added token's, else the model's.
fn token_of(tokenizer: &Value, text: &str) -> Option<u32> {
    let added = tokenizer.get("added_tokens").and_then(Value::as_array);
    added
        .into_iter()
        .flatten()
        .find(|t| t.get("content").and_then(Value::as_str) == Some(text))
        .and_then(|t| t.get("id"))
        .or_else(|| tokenizer.get("model")?.get("vocab")?.get(text))
        .and_then(Value::as_u64)
        .and_then(|id| u32::try_from(id).ok())
}

/// The special ids and the chat template, under llama.cpp's keys.
fn tokenizer_metadata(
    w: &mut GgufWriter,
    dir: &Path,
    cfg: &HfConfig,
    tokenizer: &Value,
) -> Result<()> {
    let tc = opt_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let gen = opt_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
    // A token named by its text in tokenizer_config.json (`"eos_token": "<eos>"` or
    // `{"content": "<eos>", …}`).
    let named = |key: &str| {
        let v = tc.get(key)?;
        let text = v.as_str().or_else(|| v.get("content")?.as_str())?;
        token_of(tokenizer, text)
    };
    let ids = [
        (
            "bos",
            token_id(gen.get("bos_token_id"))
                .or(cfg.bos)
                .or_else(|| named("bos_token")),
        ),
        (
            "eos",
            token_id(gen.get("eos_token_id"))
                .or(cfg.eos)
                .or_else(|| named("eos_token")),
        ),
        (
            "padding",
            token_id(gen.get("pad_token_id"))
                .or(cfg.pad)
                .or_else(|| named("pad_token")),
        ),
        ("unknown", named("unk_token")),
    ];
    for (name, id) in ids {
        if let Some(id) = id {
            w.metadata(&format!("tokenizer.ggml.{name}_token_id"), Meta::U32(id));
        }
    }
    let jinja = dir.join("chat_template.jinja");
    let template = if jinja.is_file() {
        Some(std::fs::read_to_string(&jinja).map_err(io(&jinja))?)
    } else {
        match tc.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: the one named "default", else the first.
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or(list.first())
                .and_then(|t| t.get("template")?.as_str())
                .map(str::to_string),
            _ => None,
        }
    };
    if let Some(t) = template {
        w.metadata("tokenizer.chat_template", Meta::String(t));
    }
    Ok(())
}

/// The checkpoint's safetensors files: those `model.safetensors.index.json` names, else
/// `model.safetensors`, else the folder's only `.safetensors` file.
fn open_weights(dir: &Path) -> Result<Vec<TensorFile>> {
    if let Some(index) = opt_json(&dir.join("model.safetensors.index.json"))? {
        let map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("model.safetensors.index.json has no weight_map"))?;
        let mut names: Vec<&str> = map.values().filter_map(Value::as_str).collect();
        names.sort_unstable();
        names.dedup();
        return names
            .iter()
            .map(|n| {
                // A shard lies in the folder (or below it): a name that is absolute or climbs
                // out with `..` would open whatever file it names.
                let inside = Path::new(n)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
                if !inside || n.is_empty() {
                    return Err(bad(format!(
                        "model.safetensors.index.json names {n:?}, not a file in the checkpoint's folder"
                    )));
                }
                TensorFile::open(&dir.join(n))
            })
            .collect();
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![TensorFile::open(&single)?]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    match found.len() {
        1 => Ok(vec![TensorFile::open(&found.remove(0))?]),
        0 => Err(bad(format!("{} holds no .safetensors file", dir.display()))),
        _ => Err(bad(format!(
            "{} holds several .safetensors files but no model.safetensors.index.json",
            dir.display()
        ))),
    }
}

/// How a checkpoint's matrices are stored once converted (norms are always F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightType {
    /// 8-bit blocks (default): a quarter of f32's bytes, so decode (which reads every weight
    /// once a step) runs about twice as fast as with f16, and close to the original (SmolLM2's
    /// logits move by a few hundredths on average).
    #[default]
    Q8_0,
    /// Half precision: the checkpoint's bf16 or f16 values to within f16's rounding.
    F16,
    /// The checkpoint's values exactly.
    F32,
}

impl WeightType {
    fn ggml(self) -> GgmlType {
        match self {
            WeightType::Q8_0 => GgmlType::Q8_0,
            WeightType::F16 => GgmlType::F16,
            WeightType::F32 => GgmlType::F32,
        }
    }

    /// `x` (rows of a multiple of 32 values) in this type's bytes.
    fn encode(self, x: &[f32]) -> Vec<u8> {
        match self {
            WeightType::Q8_0 => to_q8_0(x),
            WeightType::F16 => x
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            WeightType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

impl std::str::FromStr for WeightType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<WeightType, String> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" | "q8" => Ok(WeightType::Q8_0),
            "f16" => Ok(WeightType::F16),
            "f32" => Ok(WeightType::F32),
            other => Err(format!(
                "unknown weight type {other:?} (expected q8_0, f16 or f32)"
            )),
        }
    }
}

impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightType::Q8_0 => "q8_0",
            WeightType::F16 => "f16",
            WeightType::F32 => "f32",
        })
    }
}

/// Rows of a matrix converted at a time.
const SLICE_ROWS: usize = 4096;

/// The checkpoint's tensors by name, with the prefix of the text decoder found.
struct Tensors<'a> {
    by_name: BTreeMap<String, (&'a TensorFile, Vec<usize>)>,
    prefix: &'static str,
    cfg: &'a HfConfig,
    weights: WeightType,
}

impl<'a> Tensors<'a> {
    fn new(files: &'a [TensorFile], cfg: &'a HfConfig, weights: WeightType) -> Result<Tensors<'a>> {
        let mut by_name = BTreeMap::new();
        for f in files {
            for (name, shape) in f.tensors() {
                by_name.insert(name, (f, shape));
            }
        }
        let prefix = [
            "model.",
            "model.language_model.",
            "language_model.model.",
            "",
        ]
        .into_iter()
        .find(|p| by_name.contains_key(&format!("{p}embed_tokens.weight")))
        .ok_or_else(|| bad("the checkpoint has no embed_tokens.weight"))?;
        let biased = by_name
            .keys()
            .find(|n| n.starts_with(prefix) && n.contains(".layers.") && n.ends_with(".bias"));
        if let Some(name) = biased {
            return Err(bad(format!(
                "tensor {name}: projections with biases are not supported"
            )));
        }
        Ok(Tensors {
            by_name,
            prefix,
            cfg,
            weights,
        })
    }

    /// The file holding `name`.
    fn file(&self, name: &str) -> Result<&'a TensorFile> {
        let (file, _) = self
            .by_name
            .get(name)
            .ok_or_else(|| Error::MissingTensor { name: name.into() })?;
        Ok(file)
    }

    /// Every tensor weft's model file reads, converted, in GGUF names.
    fn write_all(&self, w: &mut GgufWriter) -> Result<()> {
        let c = self.cfg;
        let p = self.prefix;
        let (qd, kvd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let gemma = c.family == Family::Gemma3;
        let embd = format!("{p}embed_tokens.weight");
        let vocab = match c.vocab {
            Some(v) => v,
            None => self
                .by_name
                .get(&embd)
                .and_then(|(_, s)| s.first().copied())
                .unwrap_or(0),
        };
        self.matrix(w, &embd, "token_embd.weight", vocab, c.n_embd, None)?;
        self.norm(
            w,
            &format!("{p}norm.weight"),
            "output_norm.weight",
            c.n_embd,
        )?;
        // An untied head that is not there is the embedding, as llama.cpp reads such a file.
        let head = ["lm_head.weight", "language_model.lm_head.weight"]
            .into_iter()
            .find(|n| self.by_name.contains_key(*n));
        if let (false, Some(head)) = (c.tied, head) {
            self.matrix(w, head, "output.weight", vocab, c.n_embd, None)?;
        }
        for i in 0..c.n_layers {
            let hf = |s: &str| format!("{p}layers.{i}.{s}.weight");
            let gg = |s: &str| format!("blk.{i}.{s}.weight");
            // Llama's Q and K go from rotate_half's halves to adjacent pairs.
            let (q_perm, k_perm) = match c.family {
                Family::Llama => (Some(c.n_head), Some(c.n_head_kv)),
                Family::Gemma3 => (None, None),
            };
            self.matrix(
                w,
                &hf("self_attn.q_proj"),
                &gg("attn_q"),
                qd,
                c.n_embd,
                q_perm,
            )?;
            self.matrix(
                w,
                &hf("self_attn.k_proj"),
                &gg("attn_k"),
                kvd,
                c.n_embd,
                k_perm,
            )?;
            self.matrix(
                w,
                &hf("self_attn.v_proj"),
                &gg("attn_v"),
                kvd,
                c.n_embd,
                None,
            )?;
            self.matrix(
                w,
                &hf("self_attn.o_proj"),
                &gg("attn_output"),
                c.n_embd,
                qd,
                None,
            )?;
            self.matrix(
                w,
                &hf("mlp.gate_proj"),
                &gg("ffn_gate"),
                c.n_ff,
                c.n_embd,
                None,
            )?;
            self.matrix(w, &hf("mlp.up_proj"), &gg("ffn_up"), c.n_ff, c.n_embd, None)?;
            self.matrix(
                w,
                &hf("mlp.down_proj"),
                &gg("ffn_down"),
                c.n_embd,
                c.n_ff,
                None,
            )?;
            self.norm(w, &hf("input_layernorm"), &gg("attn_norm"), c.n_embd)?;
            if gemma {
                self.norm(
                    w,
                    &hf("post_attention_layernorm"),
                    &gg("post_attention_norm"),
                    c.n_embd,
                )?;
                self.norm(
                    w,
                    &hf("pre_feedforward_layernorm"),
                    &gg("ffn_norm"),
                    c.n_embd,
                )?;
                self.norm(
                    w,
                    &hf("post_feedforward_layernorm"),
                    &gg("post_ffw_norm"),
                    c.n_embd,
                )?;
                self.norm(w, &hf("self_attn.q_norm"), &gg("attn_q_norm"), c.head_dim)?;
                self.norm(w, &hf("self_attn.k_norm"), &gg("attn_k_norm"), c.head_dim)?;
            } else {
                self.norm(
                    w,
                    &hf("post_attention_layernorm"),
                    &gg("ffn_norm"),
                    c.n_embd,
                )?;
            }
        }
        Ok(())
    }

    /// A `rows × cols` matrix in the weight type asked for, its rows first permuted for
    /// `permute_heads` heads.
    fn matrix(
        &self,
        w: &mut GgufWriter,
        hf: &str,
        gguf: &str,
        rows: usize,
        cols: usize,
        permute_heads: Option<usize>,
    ) -> Result<()> {
        if !cols.is_multiple_of(32) {
            return Err(bad(format!("{hf}: {cols} columns is not a multiple of 32")));
        }
        let file = self.file(hf)?;
        let bytes = match permute_heads {
            Some(heads) => {
                let x = file.f32(hf, &[rows, cols])?;
                self.weights
                    .encode(&pairs_from_halves(&x, heads, rows, cols))
            }
            // A slice of rows at a time: an embedding table in f32 would be 4 bytes a weight.
            None => {
                let mut bytes = Vec::new();
                for start in (0..rows).step_by(SLICE_ROWS) {
                    let slice = start..(start + SLICE_ROWS).min(rows);
                    bytes.extend(
                        self.weights
                            .encode(&file.f32_rows(hf, &[rows, cols], slice)?),
                    );
                }
                bytes
            }
        };
        w.tensor(
            gguf,
            self.weights.ggml(),
            &[cols as u64, rows as u64],
            bytes,
        );
        Ok(())
    }

    /// A norm weight as F32 (Gemma's with 1 added).
    fn norm(&self, w: &mut GgufWriter, hf: &str, gguf: &str, n: usize) -> Result<()> {
        let mut x = self.file(hf)?.f32(hf, &[n])?;
        if self.cfg.family == Family::Gemma3 {
            x.iter_mut().for_each(|v| *v += 1.0);
        }
        let bytes = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.tensor(gguf, GgmlType::F32, &[n as u64], bytes);
        Ok(())
    }
}

/// Reorders the rows of each head of a Q or K projection (`rows × cols`, `heads` heads) from
/// Hugging Face's layout, where RoPE rotates row `i` with row `i + d/2` of the head, to
/// llama.cpp's, where it rotates rows `2i` and `2i + 1`: new row `2i + j` is old row
/// `j·d/2 + i`. This is llama.cpp's `LlamaModel.permute`.
pub fn pairs_from_halves(x: &[f32], heads: usize, rows: usize, cols: usize) -> Vec<f32> {
    let (d, half) = (rows / heads, rows / heads / 2);
    let mut out = vec![0.0; x.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let (to, from) = (h * d + 2 * i + j, h * d + j * half + i);
                out[to * cols..(to + 1) * cols].copy_from_slice(&x[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

/// `x` (a multiple of 32 values) as ggml Q8_0 blocks: an f16 scale, then 32 signed bytes.
pub fn to_q8_0(x: &[f32]) -> Vec<u8> {
    let n_blocks = x.len() / 32;
    let mut out = Vec::with_capacity(n_blocks * 34);
    let (mut qs, mut d) = (vec![0i8; 32 * 1024], vec![0f32; 1024]);
    for chunk in x.chunks(32 * 1024) {
        let blocks = chunk.len() / 32;
        quantize_row_q8_0(chunk, &mut qs[..chunk.len()], &mut d[..blocks]);
        for b in 0..blocks {
            out.extend_from_slice(&half::f16::from_f32(d[b]).to_le_bytes());
            out.extend(qs[b * 32..(b + 1) * 32].iter().map(|&q| q as u8));
        }
    }
    out
}

#[cfg(test)]
mod tests;
